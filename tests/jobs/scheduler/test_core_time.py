"""The core knows time: baselines, reservations, shortest work first, decayed usage, costed reclaim, estimates.

Each case is a small layout whose right answer can be worked out by hand;
the comment above it says how.
"""

from __future__ import annotations

from dataclasses import replace

from jobs.scheduler.core import (
    Ordering,
    OwnerUsage,
    Reason,
    SchedulerConfig,
    SlurmWeights,
    Workload,
    planned_run_s,
    schedule,
)
from jobs.scheduler.core.estimates import IN_QUEUE, RESERVED
from tests.jobs.scheduler.layouts import job, node, quota, running, snapshot

NOW = 10_000.0
# Age alone orders the slurm baseline in these cases: the oldest first.
AGE_ONLY = SchedulerConfig(ordering=Ordering.SLURM, slurm=SlurmWeights(age=1.0, fairshare=0.0, job_size=0.0))


def timed(workload: Workload, *, limit: float | None = None, predicted: float | None = None) -> Workload:
    """Return the workload with a time limit and a predicted run time."""
    return replace(workload, limit_s=limit, predicted_s=predicted)


def busy(name: str, gpus: tuple[int, ...], *, tenant: str = "z", limit: float, started: float = 9_000.0) -> Workload:
    """Return a job of tenant `tenant` running on node n1's `gpus` since `started` with a time limit."""
    return timed(running(job(name, tenant, gpus=len(gpus)), ("n1", gpus), started=started), limit=limit)


def test_strict_fifo_waits_behind_its_head_and_backfill_skips_it() -> None:
    # 2 GPUs free; the head asks 4. FIFO starts nothing, backfill starts the 1-GPU job behind it.
    held = [busy("r", tuple(range(6)), limit=5_000.0)]
    pending = [job("head", gpus=4, at=1.0), job("small", gpus=1, at=2.0)]
    quotas = [quota("a", 0, 8), quota("z", 0, 8)]
    fifo = schedule(snapshot([node("n1")], quotas, pending, running_now=held, config=SchedulerConfig(Ordering.FIFO)))
    assert not fifo.placements
    assert fifo.waiting["small"].reason is Reason.BEHIND_QUEUE_HEAD
    backfill = schedule(
        snapshot([node("n1")], quotas, pending, running_now=held, config=SchedulerConfig(Ordering.BACKFILL))
    )
    assert list(backfill.placements) == ["small"]
    assert not backfill.reservations and not backfill.preemptions


def test_slurm_reserves_for_its_head_and_backfills_only_what_ends_before() -> None:
    # r holds 6 of n1's 8 GPUs until 9,000 + 5,000 = 14,000 at the latest. The head (8 GPUs, oldest) is reserved
    # all of n1 from 14,000. "short" (2 GPUs, limit 1,000: done by 11,000) may use 2 of the reserved GPUs now;
    # "long" (limit 10,000: still running at 14,000) may not, although 2 GPUs are free when its turn comes.
    held = [busy("r", tuple(range(6)), limit=5_000.0)]
    pending = [
        timed(job("head", gpus=8, at=1.0), limit=3_600.0),
        timed(job("long", gpus=2, at=2.0), limit=10_000.0),
        timed(job("short", gpus=2, at=3.0), limit=1_000.0),
    ]
    quotas = [quota("a", 0, 16), quota("z", 0, 8)]
    decisions = schedule(snapshot([node("n1")], quotas, pending, running_now=held, config=AGE_ONLY))
    assert list(decisions.placements) == ["short"]
    (reservation,) = decisions.reservations
    assert (reservation.workload, reservation.start_at) == ("head", 14_000.0)
    assert sorted(reservation.allocation[0].gpu_uuids) == sorted(f"n1-gpu{i}" for i in range(8))
    assert "long" in decisions.waiting and "head" in decisions.waiting


def test_without_reservations_slurm_lets_long_work_take_the_heads_gpus() -> None:
    held = [busy("r", tuple(range(6)), limit=5_000.0)]
    pending = [timed(job("head", gpus=8, at=1.0), limit=3_600.0), timed(job("long", gpus=2, at=2.0), limit=10_000.0)]
    quotas = [quota("a", 0, 16), quota("z", 0, 8)]
    config = replace(AGE_ONLY, reservations=False)
    decisions = schedule(snapshot([node("n1")], quotas, pending, running_now=held, config=config))
    assert list(decisions.placements) == ["long"] and not decisions.reservations


def test_slurm_priority_follows_the_decayed_fair_share() -> None:
    # Equal guarantees; tenant b used nine times what a used lately: a's job goes first on the one free GPU.
    held = [busy("r", tuple(range(7)), limit=5_000.0)]
    pending = [job("b1", "b", at=1.0), job("a1", "a", at=2.0)]
    usage = (OwnerUsage("p", "a", None, 1_000.0), OwnerUsage("p", "b", None, 9_000.0))
    quotas = [quota("a", 4, 8), quota("b", 4, 8), quota("z", 0, 8)]
    config = SchedulerConfig(ordering=Ordering.SLURM)
    decisions = schedule(replace(snapshot([node("n1")], quotas, pending, running_now=held, config=config), usage=usage))
    assert list(decisions.placements) == ["a1"]


def test_fairshare_yields_to_the_tenant_that_used_less_lately() -> None:
    # Both tenants hold nothing now and have equal quotas: only their decayed usage tells them apart.
    held = [busy("r", tuple(range(7)), limit=5_000.0)]
    pending = [job("b1", "b", at=1.0), job("a1", "a", at=2.0)]
    quotas = [quota("a", 4, 8), quota("b", 4, 8), quota("z", 0, 8)]
    base = snapshot([node("n1")], quotas, pending, running_now=held)
    assert list(schedule(base).placements) == ["b1"], "without history, the earlier submission"
    usage = (OwnerUsage("p", "a", None, 1_000.0), OwnerUsage("p", "b", None, 9_000.0))
    assert list(schedule(replace(base, usage=usage)).placements) == ["a1"]


def test_inside_a_project_the_least_planned_gpu_time_goes_first() -> None:
    # One free GPU. "long" was submitted first but is predicted to take 10 h; "quick" 10 min.
    held = [busy("r", tuple(range(7)), limit=5_000.0)]
    pending = [timed(job("long", at=1.0), predicted=36_000.0), timed(job("quick", at=2.0), predicted=600.0)]
    decisions = schedule(snapshot([node("n1")], [quota("a", 4, 8), quota("z", 0, 8)], pending, running_now=held))
    assert list(decisions.placements) == ["quick"]


def test_a_prediction_is_capped_by_the_limit_and_reduced_by_kept_progress() -> None:
    assert planned_run_s(timed(job("x"), limit=100.0, predicted=500.0)) == 100.0
    assert planned_run_s(replace(timed(job("x"), predicted=500.0), attained_s=200.0)) == 300.0
    assert planned_run_s(timed(job("x"), limit=100.0)) == 100.0
    assert planned_run_s(job("x")) is None


def test_a_workload_starved_past_the_threshold_gets_the_reservation() -> None:
    # "old" (8 GPUs) has waited past starvation_s; b's long job may not take the free GPUs it is reserved,
    # b's short job (done before r's limit) may.
    held = [busy("r", tuple(range(4)), limit=5_000.0)]
    config = SchedulerConfig(starvation_s=3_600.0)
    pending = [
        timed(job("old", "a", gpus=8, at=0.0), limit=3_600.0),
        timed(job("b-long", "b", gpus=2, at=9_000.0), limit=50_000.0),
        timed(job("b-short", "b", gpus=2, at=9_500.0), limit=2_000.0),
    ]
    quotas = [quota("a", 4, 16), quota("b", 4, 16), quota("z", 4, 8)]  # r runs within z's guarantee: no reclaim
    decisions = schedule(snapshot([node("n1")], quotas, pending, running_now=held, config=config))
    assert list(decisions.placements) == ["b-short"] and not decisions.preemptions
    assert [r.workload for r in decisions.reservations] == ["old"]
    assert decisions.reservations[0].start_at == 14_000.0
    assert decisions.estimates["old"].start_at == 14_000.0


def test_a_workload_preempted_max_times_is_protected() -> None:
    # a is within its guarantee and b borrows all of n1: b's job goes, unless it was preempted 3 times already.
    held = [running(job("b1", "b", gpus=8), ("n1", tuple(range(8))), started=1_000.0)]
    quotas = [quota("a", 8, 8), quota("b", 0, 8)]
    claim = [job("a1", "a", gpus=8, at=5_000.0)]
    assert [p.victim for p in schedule(snapshot([node("n1")], quotas, claim, running_now=held)).preemptions] == ["b1"]
    protected = [replace(held[0], preemptions=3)]
    decisions = schedule(snapshot([node("n1")], quotas, claim, running_now=protected))
    assert not decisions.preemptions and "a1" in decisions.waiting


def test_reclaim_waits_when_the_borrower_is_about_to_finish() -> None:
    # b1 has run 9,000 s on 8 GPUs without a checkpoint: preempting it loses 8 x (9,000 + 60) GPU-s. It is predicted
    # to end in 100 s, which saves a1 only 8 x 100 GPU-s: a1 waits. Predicted to run 10 h more, it is preempted.
    quotas = [quota("a", 8, 8), quota("b", 0, 8)]
    claim = [job("a1", "a", gpus=8, at=5_000.0)]
    base = running(job("b1", "b", gpus=8), ("n1", tuple(range(8))), started=1_000.0)
    ending = [timed(base, predicted=9_100.0)]
    decisions = schedule(snapshot([node("n1")], quotas, claim, running_now=ending))
    assert not decisions.preemptions
    assert decisions.estimates["a1"].start_at == 10_100.0
    later = [timed(base, predicted=9_000.0 + 36_000.0)]
    (preemption,) = schedule(snapshot([node("n1")], quotas, claim, running_now=later)).preemptions
    assert (preemption.victim, preemption.lost_gpu_seconds, preemption.overhead_gpu_seconds) == (
        "b1",
        8 * 9_000.0,
        8 * 60.0,
    )


def test_estimates_follow_queue_order_on_planned_ends() -> None:
    # n1 is full until r's predicted end at 12,000. p1 (8 GPUs, 1,000 s) is planned less GPU-time than p2
    # (4 GPUs, 5,000 s), so it goes first: p1 at 12,000, p2 when p1 ends at 13,000.
    held = [timed(running(job("r", "z", gpus=8), ("n1", tuple(range(8))), started=9_000.0), predicted=3_000.0)]
    pending = [timed(job("p2", gpus=4, at=1.0), predicted=5_000.0), timed(job("p1", gpus=8, at=2.0), predicted=1_000.0)]
    config = SchedulerConfig(reservations=False)
    quotas = [quota("a", 0, 16), quota("z", 0, 8)]
    decisions = schedule(snapshot([node("n1")], quotas, pending, running_now=held, config=config))
    assert {k: (e.start_at, e.basis) for k, e in decisions.estimates.items()} == {
        "p1": (12_000.0, IN_QUEUE),
        "p2": (13_000.0, IN_QUEUE),
    }


def test_work_over_its_limit_is_estimated_from_its_owners_running_work() -> None:
    # Tenant a may hold 4 GPUs and holds 4 until 11,000 (predicted): its next job starts then.
    held = [timed(running(job("a0", "a", gpus=4), ("n1", (0, 1, 2, 3)), started=9_000.0), predicted=2_000.0)]
    decisions = schedule(snapshot([node("n1")], [quota("a", 0, 4)], [job("a1", "a", gpus=2)], running_now=held))
    assert decisions.waiting["a1"].reason is Reason.QUOTA_LIMIT
    assert decisions.estimates["a1"].start_at == 11_000.0


def test_no_estimate_without_any_notion_of_time() -> None:
    # Nothing running has a limit or a prediction: nothing says when the GPUs come back.
    held = [running(job("r", "z", gpus=8), ("n1", tuple(range(8))), started=9_000.0)]
    decisions = schedule(snapshot([node("n1")], [quota("a", 0, 8), quota("z", 0, 8)], [job("p")], running_now=held))
    assert "p" in decisions.waiting and "p" not in decisions.estimates


def test_reserved_basis_when_the_reservation_is_the_earlier_bound() -> None:
    # r's prediction is unknown but its limit ends at 14,000: the queue plan cannot say, the reservation can.
    held = [busy("r", tuple(range(8)), limit=5_000.0)]
    decisions = schedule(
        snapshot(
            [node("n1")],
            [quota("a", 0, 8), quota("z", 0, 8)],
            [timed(job("head", gpus=8), limit=100.0)],
            running_now=held,
            config=AGE_ONLY,
        )
    )
    assert decisions.estimates["head"].start_at == 14_000.0
    assert decisions.estimates["head"].basis == RESERVED
