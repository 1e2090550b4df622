"""Each policy on hand-made traces whose right answer is worked out by hand: when each job starts.

One node of 8 GPUs, one tenant holding it all. Every job states its time
limit (`TraceJob.limit_s`), so no draw is involved, and nobody checkpoints.

The blocked-head trace: A (5 GPUs, runs 1,000 s, limit 1,000 s) starts at
0; B (8 GPUs, 100 s, limit 200 s) arrives at 1 s and cannot fit until A
ends; C (1 GPU, 400 s, limit 500 s) arrives at 2 s and would end by 502 s,
before A's limit; D (2 GPUs, 4,000 s, limit 5,000 s) arrives at 3 s and
would still hold 2 GPUs at 1,000 s, when B needs all 8.

- strict FIFO: nothing passes B; B starts at 1,000 s, C and D at 1,100 s;
- backfill (greedy, no reservation): C at 2 s and D at 3 s pass B, which
  waits for D: B starts at 4,003 s;
- slurm (EASY backfill, a reservation for B at A's limit, 1,000 s): C may
  pass (its limit ends before the reservation), D may not; B starts at
  1,000 s, D at 1,100 s. PriorityWeightJobSize is 0 here, so age alone
  orders the jobs and B, the oldest, is the top blocked one (with
  PriorityFavorSmall, C and D would outrank it and simply start).

The `backfill` and `slurm` cases need the core's policies of issue 31.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from jobs.scheduler.core import Ordering, ProjectQuota, SlurmWeights, TenantQuota
from jobs.scheduler.simulator.build import POOL
from jobs.scheduler.simulator.engine import Settings, Simulation
from jobs.scheduler.simulator.traces import Trace, TraceJob, TraceNode
from jobs.scheduler.simulator.users import LimitModel

TENANTS = (TenantQuota("t", POOL, 8, 64, 8.0),)  # a limit far above the node: only capacity blocks
PROJECTS = (ProjectQuota("t", "t", POOL, 8, 64, 1.0),)
NODE = TraceNode("n0", 8, "V100", 64_000, 512_000)
BLOCKED_HEAD = Trace(
    "blocked-head",
    (NODE,),
    (
        TraceJob("A", "t", 0.0, 1_000.0, 5, limit_s=1_000.0),
        TraceJob("B", "t", 1.0, 100.0, 8, limit_s=200.0),
        TraceJob("C", "t", 2.0, 400.0, 1, limit_s=500.0),
        TraceJob("D", "t", 3.0, 4_000.0, 2, limit_s=5_000.0),
    ),
)


def settings(ordering: Ordering, **overrides: Any) -> Settings:
    base = Settings(ordering, TENANTS, PROJECTS, checkpoints=None, slurm=SlurmWeights(job_size=0.0))
    return replace(base, **overrides)


def starts(trace: Trace, ordering: Ordering) -> dict[str, float]:
    simulation = Simulation(trace, settings(ordering))
    summary = simulation.run().summary
    assert summary["unfinished"] == 0 and summary["quota_violations"] == 0
    return dict(sorted(simulation.recorder.first_start.items()))


def test_strict_fifo_blocks_behind_a_head_that_does_not_fit() -> None:
    assert starts(BLOCKED_HEAD, Ordering.FIFO) == {"A": 0.0, "B": 1_000.0, "C": 1_100.0, "D": 1_100.0}


def test_backfill_lets_smaller_jobs_pass_a_blocked_head_without_a_reservation() -> None:
    assert starts(BLOCKED_HEAD, Ordering.BACKFILL) == {"A": 0.0, "B": 4_003.0, "C": 2.0, "D": 3.0}


def test_slurm_easy_backfill_passes_a_short_job_but_not_one_that_delays_the_reservation() -> None:
    assert starts(BLOCKED_HEAD, Ordering.SLURM) == {"A": 0.0, "B": 1_000.0, "C": 2.0, "D": 1_100.0}


@pytest.mark.parametrize("ordering", list(Ordering))
def test_no_policy_preempts_here_and_every_job_finishes(ordering: Ordering) -> None:
    # One tenant holding its whole guarantee: nothing to reclaim, whatever the policy.
    summary = Simulation(BLOCKED_HEAD, settings(ordering)).run().summary
    assert (summary["finished"], summary["preemptions"], summary["killed_at_limit"]) == (4, 0, 0)


def test_fifo_waits_by_size_on_the_blocked_head_trace() -> None:
    # Waits: A 0, B 999, C 1,098, D 1,097. Sizes: C is 1 GPU; A, B and D are 2-8.
    summary = Simulation(BLOCKED_HEAD, settings(Ordering.FIFO)).run().summary
    assert summary["wait_by_size"] == {
        "1": {"jobs": 1, "mean_s": 1_098.0, "max_s": 1_098.0},
        "2-8": {"jobs": 3, "mean_s": round((999 + 1_097) / 3, 1), "max_s": 1_097.0},
        ">8": {"jobs": 0, "mean_s": 0.0, "max_s": 0.0},
    }
    assert summary["mean_wait_s"] == round((999 + 1_098 + 1_097) / 4, 1)


def test_a_job_still_running_at_its_limit_is_killed_there() -> None:
    # K needs 1,000 s but asked for 600: it is killed at 600 s with 400 s of 4 GPUs undone; L then runs.
    trace = Trace(
        "limit",
        (NODE,),
        (TraceJob("K", "t", 0.0, 1_000.0, 4, limit_s=600.0), TraceJob("L", "t", 10.0, 100.0, 8, limit_s=200.0)),
    )
    simulation = Simulation(trace, settings(Ordering.FIFO))
    summary = simulation.run().summary
    assert simulation.recorder.finished_at == {"K": 600.0, "L": 700.0}
    assert (summary["finished"], summary["killed_at_limit"]) == (2, 1)
    assert summary["killed_gpu_hours_cut"] == round(4 * 400 / 3600, 1)
    assert summary["mean_jct_s"] == (600.0 + 690.0) / 2


def test_the_pool_maximum_caps_a_drawn_limit_and_kills_a_longer_job() -> None:
    # No limit in the trace: the draw is at most the maximum (1,000 s here), so a 5,000 s job dies at 1,000 s.
    trace = Trace("cap", (NODE,), (TraceJob("long", "t", 0.0, 5_000.0, 1),))
    limits = LimitModel(max_runtime_s=1_000.0)
    summary = Simulation(trace, settings(Ordering.FIFO, limits=limits, chains=False)).run().summary
    assert (summary["killed_at_limit"], summary["mean_jct_s"]) == (1, 1_000.0)


def test_a_job_longer_than_the_maximum_runs_as_a_chain() -> None:
    # 5,000 s of work under a 1,000 s maximum: five jobs of 1,000 s back to back, one completion at 5,000 s.
    # Each later job asks the maximum again and resumes from what the one before saved at its limit.
    trace = Trace("chain", (NODE,), (TraceJob("long", "t", 0.0, 5_000.0, 1),))
    simulation = Simulation(trace, settings(Ordering.FIFO, limits=LimitModel(max_runtime_s=1_000.0)))
    summary = simulation.run().summary
    assert (summary["killed_at_limit"], summary["chained_continuations"], summary["mean_jct_s"]) == (0, 4, 5_000.0)
    assert simulation.recorder.finished_at == {"long": 5_000.0}
