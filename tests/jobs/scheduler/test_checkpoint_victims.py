"""Checkpoint-aware preemption: among equal victims the one that loses the least work goes first."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduler.core import (
    Preemption,
    Reason,
    SchedulerConfig,
    Snapshot,
    Workload,
    last_saved_at,
    lost_work,
    schedule,
)
from tests.jobs.scheduler.layouts import job, node, quota, running, snapshot
from tests.jobs.scheduler.test_core_properties import apply, clusters

NOW = 10_000.0
PLAIN = SchedulerConfig(checkpoint_aware=False)


def borrowers(*checkpoints: float | None, gpus: int = 4) -> list[Workload]:
    """Return tenant b's workloads filling node n1, b0 started first; each with its checkpoint time."""
    return [
        replace(
            running(job(f"b{i}", "b", gpus=gpus), ("n1", tuple(range(i * gpus, (i + 1) * gpus))), started=1_000.0 * i),
            checkpointed_at=checkpoint,
        )
        for i, checkpoint in enumerate(checkpoints)
    ]


def reclaim(held: list[Workload], claim: Workload, config: SchedulerConfig | None = None) -> tuple[Preemption, ...]:
    """Return the preemptions a pass makes for `claim` (tenant a within its guarantee) on the full node n1."""
    quotas = [quota("a", 4, 8), quota("b", 0, 8)]
    return schedule(snapshot([node("n1")], quotas, [claim], running_now=held, now=NOW, config=config)).preemptions


@pytest.mark.parametrize(
    ("workload", "lost"),
    [
        (job("pending", gpus=4), 0.0),
        (running(job("never", gpus=4), ("n", (0, 1, 2, 3)), started=1_000.0), 4 * 9_000.0),
        (
            replace(running(job("saved", gpus=4), ("n", (0, 1, 2, 3)), started=1_000.0), checkpointed_at=9_500.0),
            2_000.0,
        ),
        # A checkpoint from before this attempt's start belongs to an earlier attempt: it saves nothing now.
        (replace(running(job("stale", gpus=2), ("n", (0, 1)), started=5_000.0), checkpointed_at=4_000.0), 10_000.0),
        (
            replace(
                running(job("gang", gpus=2, replicas=3), ("n", (0, 1)), ("m", (0, 1)), ("o", (0, 1)), started=0.0),
                checkpointed_at=9_900.0,
            ),
            600.0,
        ),
        # A checkpoint stamped after `now` (clocks apart) never makes the loss negative.
        (replace(running(job("ahead"), ("n", (0,)), started=1_000.0), checkpointed_at=10_500.0), 0.0),
    ],
)
def test_lost_work_is_gpus_times_the_time_since_the_last_save(workload: Workload, lost: float) -> None:
    assert lost_work(workload, NOW) == lost


def test_the_last_save_is_the_latest_checkpoint_of_this_attempt_else_the_start() -> None:
    started = running(job("j"), ("n", (0,)), started=1_000.0)
    assert last_saved_at(job("pending")) is None
    assert last_saved_at(started) == 1_000.0
    assert last_saved_at(replace(started, checkpointed_at=7_000.0)) == 7_000.0
    assert last_saved_at(replace(started, checkpointed_at=500.0)) == 1_000.0


def test_without_checkpoints_the_newest_equal_victim_goes_and_its_loss_is_reported() -> None:
    # b1 started at 1,000, b0 at 0: both free the 4 GPUs, b1 has run least.
    preemptions = reclaim(borrowers(None, None), job("a1", "a", gpus=4))
    assert preemptions == (Preemption("b1", Reason.RECLAIM_GUARANTEE, "a1", 4 * 9_000.0, "", 4 * 60.0),)


def test_the_victim_that_checkpointed_last_goes_first() -> None:
    # b0 is older but checkpointed 500 s ago (2,000 GPU-s lost); b1 never did (36,000 GPU-s lost).
    preemptions = reclaim(borrowers(9_500.0, None), job("a1", "a", gpus=4))
    assert preemptions == (Preemption("b0", Reason.RECLAIM_GUARANTEE, "a1", 2_000.0, "", 4 * 60.0),)


def test_checkpoint_aware_off_gives_the_plain_newest_first_order() -> None:
    preemptions = reclaim(borrowers(9_500.0, None), job("a1", "a", gpus=4), PLAIN)
    assert preemptions == (Preemption("b1", Reason.RECLAIM_GUARANTEE, "a1", 4 * 9_000.0, "", 4 * 60.0),)


def test_several_victims_are_taken_least_lost_work_first() -> None:
    # Eight 1-GPU borrowers; the claim needs 3 of them. Save points: b0..b7 started at 0..7,000;
    # b2, b5 and b6 checkpointed recently, so they lose the least.
    checkpoints = [None, None, 9_900.0, None, None, 9_950.0, 9_800.0, None]
    preempted = {p.victim: p.lost_gpu_seconds for p in reclaim(borrowers(*checkpoints, gpus=1), job("a1", "a", gpus=3))}
    assert preempted == {"b5": 50.0, "b2": 100.0, "b6": 200.0}
    plain = {p.victim for p in reclaim(borrowers(*checkpoints, gpus=1), job("a1", "a", gpus=3), PLAIN)}
    assert plain == {"b7", "b6", "b5"}


def test_of_equally_cheap_nodes_the_one_whose_victim_loses_least_is_taken() -> None:
    # One 8-GPU borrower per node; b0 on n1 (first by name) never checkpointed, b1 on n2 did 100 s ago.
    held = [
        running(job("b0", "b", gpus=8), ("n1", tuple(range(8))), started=1_000.0),
        replace(running(job("b1", "b", gpus=8), ("n2", tuple(range(8))), started=0.0), checkpointed_at=9_900.0),
    ]
    quotas = [quota("a", 8, 16), quota("b", 0, 16)]
    claim = [job("a1", "a", gpus=8)]

    def preempted(config: SchedulerConfig) -> list[tuple[str, float]]:
        decisions = schedule(snapshot([node("n1"), node("n2")], quotas, claim, running_now=held, config=config))
        return [(p.victim, p.lost_gpu_seconds) for p in decisions.preemptions]

    assert preempted(SchedulerConfig()) == [("b1", 800.0)]
    assert preempted(PLAIN) == [("b0", 72_000.0)]


def test_priority_still_comes_before_lost_work() -> None:
    # Inside a project: the low-priority job goes even though the other one just checkpointed.
    low = replace(running(job("low", gpus=4, priority=0), ("n1", (0, 1, 2, 3)), started=0.0), checkpointed_at=None)
    mid = replace(running(job("mid", gpus=4, priority=1), ("n1", (4, 5, 6, 7)), started=0.0), checkpointed_at=9_990.0)
    quotas = [quota("a", 8, 8)]
    decisions = schedule(snapshot([node("n1")], quotas, [job("high", gpus=4, priority=2)], running_now=[low, mid]))
    assert [(p.victim, p.reason, p.lost_gpu_seconds) for p in decisions.preemptions] == [
        ("low", Reason.PRIORITY, 40_000.0)
    ]


@settings(max_examples=100, deadline=None)
@given(clusters(), st.randoms(use_true_random=False))
def test_without_checkpoints_checkpoint_aware_changes_no_decision(first: Snapshot, rng: random.Random) -> None:
    arrivals = [replace(w, id=f"late-{w.id}", priority=w.priority + 1) for w in first.pending]
    second = apply(first, schedule(first), 5_000.0, rng.sample(arrivals, len(arrivals) // 2))
    # Start times apart (and some alike), some too recent to preempt.
    second = replace(second, running=tuple(replace(w, started_at=500.0 * rng.randint(0, 9)) for w in second.running))
    aware = schedule(second)
    assert aware == schedule(replace(second, config=PLAIN))
    started = {w.id: w for w in second.running}
    for preemption in aware.preemptions:
        victim = started[preemption.victim]
        assert preemption.lost_gpu_seconds == victim.total_gpus * (5_000.0 - (victim.started_at or 0.0))
