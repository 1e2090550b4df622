"""No workload waits forever under fair share: a property over random traces replayed through the simulator.

The bound, and why it holds (docs/scheduler.md, "No starvation"). Every job
has a time limit (it is killed there), at most L. A job that has waited
`starvation_s` is *starving*; each pass serves the oldest starving job first
and, when it does not fit, reserves for it the GPUs running work is sure to
have freed within L; no later work may keep them past that. So the oldest
starving job starts within L of becoming the oldest, and each start may be
undone by at most `max_preemptions` preemptions. Inductively, a job with k
jobs submitted before it starts within

    starvation_s + (k + 1) x (max_preemptions + 1) x (L + restart overhead)

of its submission, whatever the others ask for, as long as it fits the
cluster and its owner's limits (here: every limit is the whole cluster).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduler.core import Ordering
from jobs.scheduler.simulator.build import default_quotas, gpu_hour_shares
from jobs.scheduler.simulator.engine import Settings, Simulation
from jobs.scheduler.simulator.traces import Trace, TraceJob, TraceNode
from jobs.scheduler.simulator.users import CheckpointMix, LimitModel

MAX_LIMIT_S = 20_000.0
STARVATION_S = 21_600.0  # SchedulerConfig's default


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    """Return a small random trace: 2-3 nodes of 8 GPUs, 3 tenants, up to 30 jobs of 1 GPU to 2 whole nodes."""
    nodes = tuple(TraceNode(f"n{i}", 8, "V100", 64_000, 512_000) for i in range(draw(st.integers(2, 3))))
    count = draw(st.integers(1, 30))
    jobs = []
    for number in range(count):
        gpus, replicas = draw(st.sampled_from([(1, 1), (2, 1), (4, 1), (8, 1), (8, 2)]))
        jobs.append(
            TraceJob(
                id=f"j{number:02d}",
                tenant=draw(st.sampled_from(["a", "b", "c"])),
                submitted_at=draw(st.floats(0, 60_000, allow_nan=False)),
                duration_s=draw(st.floats(60, 15_000, allow_nan=False)),
                gpus=gpus,
                replicas=replicas,
            )
        )
    jobs.sort(key=lambda j: (j.submitted_at, j.id))
    return Trace("random", nodes, tuple(jobs))


@settings(max_examples=60, deadline=None)
@given(traces(), st.booleans())
def test_every_job_starts_within_the_stated_bound(trace: Trace, checkpoints: bool) -> None:
    capacity = sum(node.gpus for node in trace.nodes)
    tenants, projects = default_quotas(gpu_hour_shares(trace.jobs), capacity)
    run = Simulation(
        trace,
        Settings(
            Ordering.FAIRSHARE,
            tenants,
            projects,
            limits=LimitModel(max_runtime_s=MAX_LIMIT_S),
            checkpoints=CheckpointMix() if checkpoints else None,
        ),
    )
    result = run.run()
    assert result.summary["unfinished"] == 0
    config = run.config
    per_job = (config.max_preemptions + 1) * (MAX_LIMIT_S + config.restart_overhead_s)
    for older, job in enumerate(trace.jobs):
        waited = run.recorder.first_start[job.id] - job.submitted_at
        assert waited <= STARVATION_S + (older + 1) * per_job, (job.id, waited)
