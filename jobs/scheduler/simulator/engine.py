"""The event loop: arrivals, completions and a scheduling pass after each batch of simultaneous events.

Virtual time only moves from event to event; nothing polls. What a policy
may know of a job's length is what the product knows: the time limit it was
submitted with (`Workload.limit_s`, drawn per job by `users.LimitModel`
unless the trace records it) and a run time predicted from similar completed
jobs (`Workload.predicted_s`, `predictor.py`, refreshed as history grows),
never its true run time. An attempt still running at its limit is killed
there and the job counts as finished (failed).

A preempted job goes back to the queue with its submission time and the
work it has left, which preemption makes larger: a job checkpoints every so
many seconds of an attempt (counted from the attempt's start: the trace's
own interval when it has one, else `checkpoint_interval_s` when the run
forces one on every job, else its draw from `users.CheckpointMix`; 0:
never), and a preempted job loses its progress since its latest checkpoint
of the attempt (since the attempt's start without one) and pays
`restart_overhead_s` of extra run time when it starts again. It comes back
with `attained_s` (the progress its checkpoints kept) and one more
`preemptions`. Before each pass the running jobs' latest checkpoints go
into the snapshot (`Workload.checkpointed_at`), so the core chooses its
victims knowing them, and so does every owner's decayed GPU-second usage
(`usage.py`, `Snapshot.usage`). `lossless_preemption` is the model before
checkpoints were modelled: progress kept, no overhead, no checkpoints fed to
the core. With `budgets` (per-tenant GPU-hour budgets over the whole trace,
`budgets.py`) the core also holds back the work of tenants whose budget is
used up, and the result says how much. With `estimates` the core also
estimates each waiting job's start, and the result says how far off the
first estimate was (`metrics.py`).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from jobs.scheduler.core import (
    Decisions,
    Node,
    Ordering,
    Preemption,
    ProjectQuota,
    SchedulerConfig,
    SlurmWeights,
    Snapshot,
    TenantQuota,
    Workload,
    last_saved_at,
)
from jobs.scheduler.frozen import schedule
from jobs.scheduler.simulator.budgets import BudgetBooks, TenantBudget
from jobs.scheduler.simulator.build import core_nodes, pending_workload
from jobs.scheduler.simulator.metrics import Recorder, Result, check_quotas
from jobs.scheduler.simulator.predictor import RuntimePredictor
from jobs.scheduler.simulator.traces import Trace, TraceJob
from jobs.scheduler.simulator.usage import UsageBooks
from jobs.scheduler.simulator.users import DAY_S, CheckpointMix, LimitModel

_ARRIVAL, _COMPLETION = 1, 0  # completions first at equal times: their GPUs are free for that pass
_BUDGET = 2  # a moment running work uses up a budget: only a pass to run

# Slurm's PriorityDecayHalfLife default (7-0).
DEFAULT_HALF_LIFE_S = 7 * DAY_S
DEFAULT_LIMITS = LimitModel()
DEFAULT_CHECKPOINTS = CheckpointMix()
DEFAULT_SLURM = SlurmWeights()


@dataclass(frozen=True, slots=True)
class Settings:
    """How a simulation runs: the policy, the quotas, what users do and what preemption costs.

    `checkpoint_aware` is `SchedulerConfig.checkpoint_aware` (off: victims newest first, checkpoints ignored).
    `checkpoint_interval_s` forces one interval on every job without its own (0: none checkpoints); None
    leaves each job to its draw from `checkpoints` (None: no job checkpoints). `limits` None: no time
    limits. `estimates` asks the core for start estimates (they cost time) and measures them.
    """

    ordering: Ordering
    tenant_quotas: tuple[TenantQuota, ...]
    project_quotas: tuple[ProjectQuota, ...]
    min_runtime_s: float = 600.0
    checkpoint_interval_s: float | None = None
    restart_overhead_s: float = 60.0
    checkpoint_aware: bool = True
    lossless_preemption: bool = False
    budgets: tuple[TenantBudget, ...] = ()
    seed: int = 0
    limits: LimitModel | None = DEFAULT_LIMITS
    checkpoints: CheckpointMix | None = DEFAULT_CHECKPOINTS
    predictions: bool = True
    decay_half_life_s: float = DEFAULT_HALF_LIFE_S
    estimates: bool = False
    reservations: bool = True
    max_preemptions: int = 3
    chains: bool = True
    slurm: SlurmWeights = DEFAULT_SLURM

    def assumptions(self) -> dict[str, Any]:
        """Return what the run assumed, as its JSON states it."""
        return {
            "policy": self.ordering.value,
            "seed": self.seed,
            "policies_read": "each job's time limit and predicted run time, never its true run time",
            "time_limits": self.limits.describe() if self.limits is not None else "none",
            "chains": (
                "a job longer than the pool's maximum runs as a chain of jobs of at most the maximum, each saving at "
                "its limit and submitted when the previous ends"
                if self.chains and self.limits is not None
                else "none: a job longer than the maximum is killed there"
            ),
            "checkpoints": self._checkpoints(),
            "restart_overhead_s": 0.0 if self.lossless_preemption else self.restart_overhead_s,
            "lossless_preemption": self.lossless_preemption,
            "victims": "checkpoint_aware" if self.checkpoint_aware else "newest_first",
            "min_runtime_s": self.min_runtime_s,
            "max_preemptions": self.max_preemptions,
            "predictions": RuntimePredictor().describe() if self.predictions else "none",
            "usage_half_life_s": self.decay_half_life_s,
            "usage": "decayed GPU-seconds per tenant and project, running work included, passed at every pass",
            "reservations": self.reservations,
            "estimates": self.estimates,
            "slurm_weights": asdict(self.slurm),
            "wait": "time pending: before the first start and after each preemption until the restart",
        }

    def _checkpoints(self) -> object:
        if self.lossless_preemption:
            return "none needed: preemption keeps all progress"
        forced = self.checkpoint_interval_s
        if forced is not None:
            return {"model": "forced", "interval_s": forced} if forced else "none"
        return self.checkpoints.describe() if self.checkpoints is not None else "none"


@dataclass
class _Running:
    workload: Workload
    finishes_at: float
    epoch: int
    interval: float  # seconds between checkpoints of this attempt; 0: never
    killed: bool  # the attempt ends at its time limit, not at its completion


@dataclass
class _World:
    """What the simulated cluster holds now."""

    nodes: dict[str, Node]
    pending: dict[str, Workload] = field(default_factory=dict)
    running: dict[str, _Running] = field(default_factory=dict)
    remaining: dict[str, float] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # (time, job id, epoch) of each running job's next checkpoint.
    checkpoints: list[tuple[float, str, int]] = field(default_factory=list)
    # Pending job ids by (project, GPUs per replica, replicas): the jobs a completion can change the prediction of.
    similar: dict[tuple[str, int, int], set[str]] = field(default_factory=lambda: defaultdict(set))


class Simulation:
    """Replays one trace under one policy; `run` returns the measured `Result`.

    Under FIFO a pass after arrivals alone, when the last pass left work
    waiting, is known to change nothing (the head still cannot start, and
    arrivals join behind it), so the core is not asked: half the passes of
    a long FIFO queue, with the same decisions. A job arriving then gets its
    start estimate at the next pass the core runs, on the same state.
    """

    # Off only in the test that checks skipping changes nothing.
    skip_stalled_fifo = True

    def __init__(self, trace: Trace, settings: Settings) -> None:
        self.trace = trace
        self.settings = settings
        self.config = SchedulerConfig(
            ordering=settings.ordering,
            min_runtime_s=settings.min_runtime_s,
            checkpoint_aware=settings.checkpoint_aware,
            explain=False,
            max_preemptions=settings.max_preemptions,
            restart_overhead_s=0.0 if settings.lossless_preemption else settings.restart_overhead_s,
            reservations=settings.reservations,
            estimates=settings.estimates,
            slurm=settings.slurm,
        )
        self.jobs: dict[str, TraceJob] = {job.id: job for job in trace.jobs}
        self.pools = trace.core_pools()
        self.world = _World(nodes={node.name: node for node in core_nodes(trace.nodes)})
        self.events: list[tuple[float, int, str]] = [(job.submitted_at, _ARRIVAL, job.id) for job in trace.jobs]
        heapq.heapify(self.events)
        capacity = sum(node.gpus for node in trace.nodes)
        self.recorder = Recorder(capacity, settings.tenant_quotas, self.jobs)
        self.stalled = False  # FIFO: the last pass left a head that cannot start, and nothing finished since
        self.last_violations = 0
        self.budgets = BudgetBooks(settings.budgets) if settings.budgets else None
        self.predictor = RuntimePredictor() if settings.predictions else None
        self.usage = UsageBooks(settings.decay_half_life_s)
        self.chained = 0  # continuations queued for jobs longer than the pool's maximum
        self.unestimated: list[str] = []  # arrived since the core's last pass: their first estimate is due

    def run(self) -> Result:
        """Return the metrics after every job has finished (or can never start), with what the run assumed."""
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, kind, job_id = heapq.heappop(self.events)
                self._handle(now, kind, job_id)
            self._pass(now)
        result = self.recorder.result(unfinished=len(self.world.pending))
        if self.budgets is not None:
            result.summary["budgets"] = self.budgets.summary(self._running(), self.recorder.last_time)
        result.summary["chained_continuations"] = self.chained
        result.summary["assumptions"] = self.settings.assumptions()
        return result

    def _running(self) -> list[Workload]:
        return [r.workload for r in self.world.running.values()]

    def limit_of(self, job: TraceJob) -> float | None:
        """Return the time limit `job` is submitted with: the trace's, else the drawn one (None: no limits)."""
        if job.limit_s is not None:
            return job.limit_s
        limits = self.settings.limits
        return limits.draw(job.id, job.duration_s, self.settings.seed) if limits is not None else None

    def _handle(self, now: float, kind: int, job_id: str) -> None:
        if kind == _BUDGET:
            self.stalled = False  # a budget is used up now: the pass may decide differently
            return
        if kind == _ARRIVAL:
            self._arrive(now, self.jobs[job_id])
            return
        job_id, _, epoch = job_id.rpartition("#")
        running = self.world.running.get(job_id)
        if running is None or running.epoch != int(epoch):
            return  # preempted since: this completion is stale
        self._end(now, running)

    def _arrive(self, now: float, job: TraceJob) -> None:
        if self.budgets is not None and self.budgets.refuses(job.tenant, self._running(), now):
            self.budgets.refused.append(job.id)
            return
        predicted = self.predictor.predict(job) if self.predictor is not None else None
        self._queue(pending_workload(job, self.limit_of(job), predicted))
        self.world.remaining[job.id] = job.duration_s
        self.recorder.arrived(job.id, now)
        if self.settings.estimates:
            self.unestimated.append(job.id)

    def _queue(self, workload: Workload) -> None:
        self.world.pending[workload.id] = workload
        if self.predictor is not None:
            self.world.similar[(workload.project, workload.gpus, workload.replicas)].add(workload.id)

    def _unqueue(self, workload_id: str) -> Workload:
        workload = self.world.pending.pop(workload_id)
        if self.predictor is not None:
            self.world.similar[(workload.project, workload.gpus, workload.replicas)].discard(workload_id)
        return workload

    def _end(self, now: float, running: _Running) -> None:
        """Finish (or, at its limit, kill) a running job's attempt at `now`."""
        workload, world = running.workload, self.world
        if self.budgets is not None:
            self.budgets.charge(workload, now)
        self._stop(workload, now)
        del world.running[workload.id]
        self.stalled = False
        if running.killed:
            ran = now - (workload.started_at if workload.started_at is not None else now)
            if self._chains(workload):
                self._continue(now, workload, ran)
                return
            self.recorder.finished(workload.id, now, unfinished_work_s=world.remaining[workload.id] - ran)
            return
        self.recorder.finished(workload.id, now)
        if self.predictor is not None:
            job = self.jobs[workload.id]
            self.predictor.observe(job, job.duration_s)
            self._repredict(job)

    def _chains(self, workload: Workload) -> bool:
        """Return whether a job killed at its limit is continued: it asked the pool's maximum and needs more."""
        limits = self.settings.limits
        return (
            self.settings.chains
            and limits is not None
            and workload.limit_s is not None
            and workload.limit_s >= limits.max_runtime_s
        )

    def _continue(self, now: float, workload: Workload, ran: float) -> None:
        """Queue the next job of a chain: a new submission at `now` resuming from what the killed one saved.

        A job longer than the pool's maximum is run the way its users run it
        under a time limit: as a chain of jobs of at most the maximum, each
        writing a checkpoint when its limit comes and submitted when the
        previous one ends (Slurm users chain with --dependency=singleton or
        a requeue). Its completion time runs from the first submission to
        the last job's end; the gaps between the jobs count as waiting.
        """
        self.world.remaining[workload.id] -= ran
        self.chained += 1
        self._queue(
            replace(
                workload,
                submitted_at=now,
                started_at=None,
                allocation=(),
                checkpointed_at=None,
                attained_s=workload.attained_s + ran,
            )
        )
        self.recorder.arrived(workload.id, now)

    def _repredict(self, done: TraceJob) -> None:
        """Refresh the predictions of the pending jobs a completion of `done` can change."""
        assert self.predictor is not None
        pending = self.world.pending
        for job_id in self.world.similar.get((done.project_name, done.gpus, done.replicas), ()):
            predicted = self.predictor.predict(self.jobs[job_id])
            if pending[job_id].predicted_s != predicted:
                pending[job_id] = replace(pending[job_id], predicted_s=predicted)

    def _pass(self, now: float) -> None:
        world = self.world
        if not world.pending and not (self.budgets is not None and self.budgets.must_pass(self._running(), now)):
            self.recorder.sample(now, world.running.values(), world.pending.values())
            return
        if self.stalled and self.skip_stalled_fifo:
            # The books are as the last pass left them: its violations are counted again, as a pass would.
            self.recorder.violations += self.last_violations
            self.recorder.sample(now, world.running.values(), world.pending.values())
            return
        self._checkpoint(now)
        snapshot = Snapshot(
            now=now,
            pools=self.pools,
            nodes=tuple(world.nodes.values()),
            tenant_quotas=self.settings.tenant_quotas,
            project_quotas=self.settings.project_quotas,
            running=tuple(r.workload for r in world.running.values()),
            pending=tuple(world.pending.values()),
            config=self.config,
            budgets=self.budgets.states(self._running(), now) if self.budgets is not None else (),
            usage=self.usage.snapshot(now),
        )
        decisions = self.decide(snapshot)
        pending_before = dict(world.pending)
        self._apply(now, decisions)
        self._note_estimates(decisions)
        if self.budgets is not None:
            self.budgets.observe(now, decisions, pending_before)
            for when, tenant in self.budgets.crossings(self._running(), now):
                heapq.heappush(self.events, (when, _BUDGET, tenant))
        self.last_violations = check_quotas(
            snapshot, [r.workload for r in world.running.values()], self.settings.tenant_quotas
        )
        self.recorder.violations += self.last_violations
        self.stalled = self.settings.ordering is Ordering.FIFO and bool(world.pending)
        self.recorder.sample(now, world.running.values(), world.pending.values())

    def decide(self, snapshot: Snapshot) -> Decisions:
        """Return the core's decisions on `snapshot` (a subclass may also look at the snapshot: the benchmark does)."""
        return schedule(snapshot)

    def _note_estimates(self, decisions: Decisions) -> None:
        """Keep the estimate of each job this pass is the first to leave waiting."""
        for job_id in self.unestimated:
            if job_id in self.world.pending:
                estimate = decisions.estimates.get(job_id)
                self.recorder.estimated(job_id, estimate.start_at if estimate is not None else None)
        self.unestimated.clear()

    def _checkpoint(self, now: float) -> None:
        """Record in the running workloads the checkpoints they have taken by `now`."""
        world, heap = self.world, self.world.checkpoints
        while heap and heap[0][0] <= now:
            _, job_id, epoch = heapq.heappop(heap)
            running = world.running.get(job_id)
            if running is None or running.epoch != epoch:
                continue  # finished or preempted since
            started = running.workload.started_at or 0.0
            latest = started + (now - started) // running.interval * running.interval
            running.workload = replace(running.workload, checkpointed_at=latest)
            heapq.heappush(heap, (latest + running.interval, job_id, epoch))

    def _apply(self, now: float, decisions: Decisions) -> None:
        world = self.world
        for preemption in decisions.preemptions:
            self._preempt(now, preemption)
        for workload_id, allocation in decisions.placements.items():
            workload = replace(self._unqueue(workload_id), started_at=now, allocation=allocation)
            self._start(workload, now)
            epoch = world.epochs[workload_id] = world.epochs[workload_id] + 1
            run_s, limit = world.remaining[workload_id], workload.limit_s
            killed = limit is not None and run_s > limit
            ends = now + (limit if killed and limit is not None else run_s)
            interval = self._interval(workload_id)
            world.running[workload_id] = _Running(workload, ends, epoch, interval, killed)
            heapq.heappush(self.events, (ends, _COMPLETION, f"{workload_id}#{epoch}"))
            if interval and now + interval < ends:
                heapq.heappush(world.checkpoints, (now + interval, workload_id, epoch))
            self.recorder.started(workload_id, now, workload.predicted_s)

    def _preempt(self, now: float, preemption: Preemption) -> None:
        """Stop the victim and requeue it with its work left, plus what it loses and its restart overhead."""
        world = self.world
        victim = world.running.pop(preemption.victim).workload
        if self.budgets is not None:
            self.budgets.charge(victim, now)
        started = victim.started_at if victim.started_at is not None else now
        world.remaining[victim.id] -= now - started
        lost = overhead = 0.0
        saved = last_saved_at(victim)
        if not self.settings.lossless_preemption and saved is not None:
            lost = now - saved
            overhead = self.settings.restart_overhead_s
            world.remaining[victim.id] += lost + overhead
        self._stop(victim, now)
        # What its checkpoints kept: the work done, less the restart overhead it still has to pay; never less
        # than before (an attempt lost whole keeps the earlier attempts' progress).
        kept = self.jobs[victim.id].duration_s - world.remaining[victim.id] + overhead
        requeued = replace(
            victim,
            started_at=None,
            allocation=(),
            checkpointed_at=None,
            attained_s=max(victim.attained_s, kept),
            preemptions=victim.preemptions + 1,
        )
        self._queue(requeued)
        if self.settings.estimates:
            self.unestimated.append(victim.id)  # only a job never estimated gets one: `Recorder.estimated`
        self.recorder.preempted(victim.id, now, victim.total_gpus * lost, victim.total_gpus * overhead)

    def _interval(self, job_id: str) -> float:
        """Return the seconds between a job's checkpoints: its trace's, else the run's forced one, else its
        draw from the run's mix; 0 for never."""
        if self.settings.lossless_preemption:
            return 0.0
        own = self.jobs[job_id].checkpoint_interval_s
        if own is None:
            own = self.settings.checkpoint_interval_s
        if own is None and self.settings.checkpoints is not None:
            own = self.settings.checkpoints.draw(job_id, self.settings.seed)
        return max(0.0, own or 0.0)

    def _start(self, workload: Workload, now: float) -> None:
        self._charge_nodes(workload, -1)
        self.usage.started(workload, now)

    def _stop(self, workload: Workload, now: float) -> None:
        self._charge_nodes(workload, 1)
        self.usage.stopped(workload, now)

    def _charge_nodes(self, workload: Workload, sign: int) -> None:
        # GPUs are freed by dropping the allocation; CPU and memory the caller tracks on the node.
        if not (workload.cpu_milli or workload.memory_mib):
            return
        for replica in workload.allocation:
            node = self.world.nodes[replica.node]
            self.world.nodes[replica.node] = replace(
                node,
                cpu_free_milli=node.cpu_free_milli + sign * workload.cpu_milli,
                memory_free_mib=node.memory_free_mib + sign * workload.memory_mib,
            )


def simulate(trace: Trace, settings: Settings) -> Result:
    """Return the metrics of replaying `trace` under `settings`."""
    return Simulation(trace, settings).run()
