"""What preemption costs in the simulator: progress since the last checkpoint plus a restart, on a hand-made trace.

One 8-GPU node. Tenant b (no guarantee) runs b1 (from 0 s) and b2 (from
1,800 s), 4 GPUs and 36,000 s each; tenant a (guarantee 4) submits a1, 4 GPUs
for 3,600 s, at 7,290 s and reclaims 4 GPUs from b. With a checkpoint every
3,600 s, b1 last saved at 7,200 s (90 s to redo) and b2 at 5,400 s (1,890 s).
A restart costs 450 s. a1 runs 7,290 to 10,890 s, when the victim restarts.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jobs.scheduler.core import Ordering, ProjectQuota, TenantQuota
from jobs.scheduler.simulator import cli
from jobs.scheduler.simulator import engine as simulator_engine
from jobs.scheduler.simulator.build import POOL, default_quotas, gpu_hour_shares
from jobs.scheduler.simulator.engine import Settings, Simulation, simulate
from jobs.scheduler.simulator.traces import Trace, TraceJob, TraceNode, load_philly
from tests.conftest import TRACES

TENANTS = (TenantQuota("a", POOL, 4, 8, 4.0), TenantQuota("b", POOL, 0, 8, 1.0))
PROJECTS = tuple(ProjectQuota(q.tenant, q.tenant, POOL, q.guaranteed, q.limit, 1.0) for q in TENANTS)
JOBS = (
    TraceJob("b1", "b", 0.0, 36_000.0, 4),
    TraceJob("b2", "b", 1_800.0, 36_000.0, 4),
    TraceJob("a1", "a", 7_290.0, 3_600.0, 4),
)
TRACE = Trace("hand-made", (TraceNode("n0", 8, "V100", 64_000, 512_000),), JOBS)
COSTLY = Settings(Ordering.FAIRSHARE, TENANTS, PROJECTS, checkpoint_interval_s=3_600.0, restart_overhead_s=450.0)
LOSS_KEYS = ("preemptions", "lost_progress_gpu_hours", "restart_overhead_gpu_hours", "preemption_lost_gpu_hours")


def outcome(summary: dict[str, Any]) -> tuple[Any, ...]:
    return (summary["finished"], summary["mean_jct_s"], *(summary[key] for key in LOSS_KEYS))


@pytest.mark.parametrize(
    ("costs", "expected"),
    [
        # b1 goes: it redoes 90 s; it restarts at 10,890 s with 36,000 - 7,290 + 90 + 450 s left: done at 40,140 s.
        # JCTs 3,600 (a1), 40,140 (b1), 36,000 (b2).
        (COSTLY, (3, 26_580.0, 1, 0.1, 0.5, 0.6)),
        # Newest first: b2 goes and redoes 1,890 s; done at 10,890 + 32,850 = 43,740 s (JCT 41,940).
        (replace(COSTLY, checkpoint_aware=False), (3, 27_180.0, 1, 2.1, 0.5, 2.6)),
        # Never checkpointing: b2 (newest) redoes all 5,490 s; done at 10,890 + 36,450 s (JCT 45,540).
        (replace(COSTLY, checkpoint_interval_s=0.0), (3, 28_380.0, 1, 6.1, 0.5, 6.6)),
        # The model before: progress kept, nothing paid; b2 (newest) is done at 10,890 + 30,510 s (JCT 39,600).
        (replace(COSTLY, lossless_preemption=True), (3, 26_400.0, 1, 0.0, 0.0, 0.0)),
    ],
    ids=["checkpoint-aware", "newest-first", "never-checkpoints", "lossless"],
)
def test_a_preempted_job_redoes_its_work_since_the_last_checkpoint_and_restarts(
    costs: Settings, expected: tuple[Any, ...]
) -> None:
    assert outcome(simulate(TRACE, costs).summary) == expected


def test_a_job_started_at_time_zero_without_a_checkpoint_loses_all_its_progress() -> None:
    # b1 alone holds the node from 0 s; at 7,290 s it redoes everything (8 x 7,290 GPU-s) and pays 8 x 450.
    # It restarts when a1 ends (10,890 s) with 36,000 + 450 s left: JCT 47,340; a1's 3,600.
    alone = replace(TRACE, jobs=(replace(JOBS[0], gpus=8), JOBS[2]))
    never = replace(COSTLY, checkpoint_interval_s=None, checkpoints=None)  # no forced interval, and no job's own
    assert outcome(simulate(alone, never).summary) == (
        2,
        25_470.0,
        1,
        16.2,
        1.0,
        17.2,
    )


def test_without_cost_a_job_started_at_time_zero_keeps_its_progress() -> None:
    # Lossless: b1 has 36,000 - 7,290 s left when it restarts at 10,890 s (JCT 39,600); a start at 0 s is a start.
    alone = replace(TRACE, jobs=(replace(JOBS[0], gpus=8), JOBS[2]))
    assert outcome(simulate(alone, replace(COSTLY, lossless_preemption=True)).summary) == (
        2,
        21_600.0,
        1,
        0.0,
        0.0,
        0.0,
    )


def test_a_job_of_the_trace_checkpoints_at_its_own_interval() -> None:
    # b2 checkpoints every 1,830 s: its third checkpoint is at 7,290 s, the moment a1 arrives, so it loses
    # no progress and goes; it restarts at 10,890 s with 36,000 - 5,490 + 450 s left (JCT 40,050).
    own = replace(TRACE, jobs=(JOBS[0], replace(JOBS[1], checkpoint_interval_s=1_830.0), JOBS[2]))
    assert outcome(simulate(own, COSTLY).summary) == (3, 26_550.0, 1, 0.0, 0.5, 0.5)


def test_the_core_sees_the_checkpoints_and_reports_the_same_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, float]] = []
    schedule = simulator_engine.schedule

    def spy(snapshot: Any) -> Any:
        decisions = schedule(snapshot)
        seen.extend((p.victim, p.lost_gpu_seconds) for p in decisions.preemptions)
        if decisions.preemptions:
            assert {w.id: w.checkpointed_at for w in snapshot.running} == {"b1": 7_200.0, "b2": 5_400.0}
        return decisions

    monkeypatch.setattr(simulator_engine, "schedule", spy)
    simulate(TRACE, COSTLY)
    assert seen == [("b1", 4 * 90.0)]


def write_trace(folder: Path) -> Path:
    """Write the hand-made trace in the Philly-derived format (one file per tenant, 1 step per second)."""
    folder.mkdir()
    row = "T\tpython3 train.py\t-n\t1\t{steps}\t{at}\t4\n"
    (folder / "a.trace").write_text(row.format(steps=3_600, at=7_290))
    (folder / "b.trace").write_text(row.format(steps=36_000, at=0) + row.format(steps=36_000, at=1_800))
    (folder / "simulation_throughputs.json").write_text(json.dumps({"v100": {repr(("T", 4)): {"null": 1.0}}}))
    return folder


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--checkpoint-interval", "3600", "--restart-overhead", "450"], (3, 26_580.0, 1, 0.1, 0.5, 0.6)),
        (
            ["--checkpoint-interval", "3600", "--restart-overhead", "450", "--plain-victims"],
            (3, 27_180.0, 1, 2.1, 0.5, 2.6),
        ),
        # Never checkpoints, 60 s restarts: b2 redoes 5,490 s and is done at 10,890 + 36,060 s (JCT 45,150).
        (["--no-checkpoints"], (3, 28_250.0, 1, 6.1, 0.1, 6.2)),
        # The default mix, seed 0: b1 checkpoints every 900 s (last at 7,200 s), b2 never, so b1 goes, redoes
        # 90 s and is done at 10,890 + 36,000 - 7,290 + 90 + 60 = 39,750 s.
        ([], (3, 26_450.0, 1, 0.1, 0.1, 0.2)),
        (["--lossless-preemption"], (3, 26_400.0, 1, 0.0, 0.0, 0.0)),
    ],
    ids=["checkpoint-aware", "plain-victims", "no-checkpoints", "default-mix", "lossless"],
)
def test_the_cli_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], expected: tuple[Any, ...]
) -> None:
    folder = write_trace(tmp_path / "trace")
    argv = ["--trace", str(folder), "--gpus", "8", "--quota", "a=4:8", "--quota", "b=0:8", *flags]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert outcome(summary) == expected
    assert summary["quota_violations"] == 0


def test_the_cli_refuses_a_negative_interval(tmp_path: Path) -> None:
    folder = write_trace(tmp_path / "trace")
    assert cli.main(["--trace", str(folder), "--gpus", "8", "--checkpoint-interval", "-1"]) == 2


@pytest.mark.traces
def test_skipping_stalled_fifo_passes_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = load_philly(TRACES / "philly-derived", 32, limit_jobs=300)
    calls = {True: 0, False: 0}
    schedule = simulator_engine.schedule
    settings = Settings(Ordering.FIFO, *default_quotas(gpu_hour_shares(trace.jobs), 32))
    summaries = {}
    for skip in (True, False):

        def counting(snapshot: Any, skip: bool = skip) -> Any:
            calls[skip] += 1
            return schedule(snapshot)

        monkeypatch.setattr(simulator_engine, "schedule", counting)
        simulation = Simulation(trace, settings)
        simulation.skip_stalled_fifo = skip
        summaries[skip] = simulation.run().summary
    assert summaries[True] == summaries[False]
    assert calls[True] < calls[False] * 0.8


def test_a_requeued_job_carries_what_its_checkpoints_kept_and_its_preemption_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # b1 is preempted at 7,290 s having saved at 7,200 s: it comes back with 7,200 s attained and one preemption.
    requeued: list[tuple[str, float, int]] = []
    schedule = simulator_engine.schedule

    def spy(snapshot: Any) -> Any:
        requeued.extend((w.id, w.attained_s, w.preemptions) for w in snapshot.pending if w.preemptions)
        return schedule(snapshot)

    monkeypatch.setattr(simulator_engine, "schedule", spy)
    summary = simulate(TRACE, COSTLY).summary
    assert requeued and set(requeued) == {("b1", 7_200.0, 1)}
    assert summary["max_preemptions_one_job"] == 1
