"""The event loop: arrivals, completions and a scheduling pass after each batch of simultaneous events.

Virtual time only moves from event to event; nothing polls. A preempted job
goes back to the queue with its submission time and the work it has left,
which preemption makes larger: a job checkpoints every `checkpoint_interval_s`
seconds of an attempt (counted from the attempt's start; the trace's own
interval for the job when it has one, else the run's; None or 0: never), and
a preempted job loses its progress since its latest checkpoint of the attempt
(since the attempt's start without one) and pays `restart_overhead_s` of
extra run time when it starts again. Before each pass the running jobs'
latest checkpoints go into the snapshot (`Workload.checkpointed_at`), so the
core chooses its victims knowing them. `lossless_preemption` is the model
before checkpoints were modelled: progress kept, no overhead, no checkpoints
fed to the core. With `budgets` (per-tenant GPU-hour budgets over the whole
trace, `budgets.py`) the core also holds back the work of tenants whose
budget is used up, and the result says how much.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from jobs.scheduler.core import (
    Decisions,
    Node,
    Ordering,
    Pool,
    Preemption,
    ProjectQuota,
    SchedulerConfig,
    Snapshot,
    TenantQuota,
    Workload,
    last_saved_at,
)
from jobs.scheduler.frozen import schedule
from jobs.scheduler.simulator.budgets import BudgetBooks, TenantBudget
from jobs.scheduler.simulator.build import POOL, core_nodes, pending_workload
from jobs.scheduler.simulator.metrics import Recorder, Result, check_quotas
from jobs.scheduler.simulator.traces import Trace, TraceJob

_ARRIVAL, _COMPLETION = 1, 0  # completions first at equal times: their GPUs are free for that pass
_BUDGET = 2  # a moment running work uses up a budget: only a pass to run


@dataclass(frozen=True, slots=True)
class Settings:
    """How a simulation runs: the policy, the minimum runtime before preemption, the quotas, what preemption costs.

    `checkpoint_aware` is `SchedulerConfig.checkpoint_aware` (off: victims newest first, checkpoints ignored).
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


@dataclass
class _Running:
    workload: Workload
    finishes_at: float
    epoch: int
    interval: float  # seconds between checkpoints of this attempt; 0: never


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


class Simulation:
    """Replays one trace under one policy; `run` returns the measured `Result`.

    Under FIFO a pass after arrivals alone, when the last pass left work
    waiting, is known to change nothing (the head still cannot start, and
    arrivals join behind it), so the core is not asked: half the passes of
    a long FIFO queue, with the same decisions.
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
        )
        self.jobs: dict[str, TraceJob] = {job.id: job for job in trace.jobs}
        self.world = _World(nodes={node.name: node for node in core_nodes(trace.nodes)})
        self.events: list[tuple[float, int, str]] = [(job.submitted_at, _ARRIVAL, job.id) for job in trace.jobs]
        heapq.heapify(self.events)
        capacity = sum(node.gpus for node in trace.nodes)
        self.recorder = Recorder(capacity, settings.tenant_quotas, self.jobs)
        self.stalled = False  # FIFO: the last pass left a head that cannot start, and nothing finished since
        self.last_violations = 0
        self.budgets = BudgetBooks(settings.budgets) if settings.budgets else None

    def run(self) -> Result:
        """Return the metrics after every job has finished (or can never start)."""
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, kind, job_id = heapq.heappop(self.events)
                self._handle(now, kind, job_id)
            self._pass(now)
        result = self.recorder.result(unfinished=len(self.world.pending))
        if self.budgets is not None:
            result.summary["budgets"] = self.budgets.summary(self._running(), self.recorder.last_time)
        return result

    def _running(self) -> list[Workload]:
        return [r.workload for r in self.world.running.values()]

    def _handle(self, now: float, kind: int, job_id: str) -> None:
        world = self.world
        if kind == _BUDGET:
            self.stalled = False  # a budget is used up now: the pass may decide differently
            return
        if kind == _ARRIVAL:
            job = self.jobs[job_id]
            if self.budgets is not None and self.budgets.refuses(job.tenant, self._running(), now):
                self.budgets.refused.append(job_id)
                return
            world.pending[job_id] = pending_workload(job)
            world.remaining[job_id] = job.duration_s
            self.recorder.arrived(job_id, now)
            return
        job_id, _, epoch = job_id.rpartition("#")
        running = world.running.get(job_id)
        if running is None or running.epoch != int(epoch):
            return  # preempted since: this completion is stale
        if self.budgets is not None:
            self.budgets.charge(running.workload, now)
        self._stop(running.workload)
        del world.running[job_id]
        self.stalled = False
        self.recorder.finished(job_id, now)

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
            pools=(Pool(POOL),),
            nodes=tuple(world.nodes.values()),
            tenant_quotas=self.settings.tenant_quotas,
            project_quotas=self.settings.project_quotas,
            running=tuple(r.workload for r in world.running.values()),
            pending=tuple(world.pending.values()),
            config=self.config,
            budgets=self.budgets.states(self._running(), now) if self.budgets is not None else (),
        )
        decisions = self.decide(snapshot)
        pending_before = dict(world.pending)
        self._apply(now, decisions)
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
            workload = replace(world.pending.pop(workload_id), started_at=now, allocation=allocation)
            self._start(workload)
            epoch = world.epochs[workload_id] = world.epochs[workload_id] + 1
            finishes = now + world.remaining[workload_id]
            interval = self._interval(workload_id)
            world.running[workload_id] = _Running(workload, finishes, epoch, interval)
            heapq.heappush(self.events, (finishes, _COMPLETION, f"{workload_id}#{epoch}"))
            if interval and now + interval < finishes:
                heapq.heappush(world.checkpoints, (now + interval, workload_id, epoch))
            self.recorder.started(workload_id, now)

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
        self._stop(victim)
        world.pending[victim.id] = replace(victim, started_at=None, allocation=(), checkpointed_at=None)
        self.recorder.preempted(victim.id, now, victim.total_gpus * lost, victim.total_gpus * overhead)

    def _interval(self, job_id: str) -> float:
        """Return the seconds between a job's checkpoints: its trace's, else the run's; 0 for never."""
        if self.settings.lossless_preemption:
            return 0.0
        own = self.jobs[job_id].checkpoint_interval_s
        interval = own if own is not None else self.settings.checkpoint_interval_s
        return max(0.0, interval or 0.0)

    def _start(self, workload: Workload) -> None:
        self._charge_nodes(workload, -1)

    def _stop(self, workload: Workload) -> None:
        self._charge_nodes(workload, 1)

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


def tenants_of(jobs: Sequence[TraceJob]) -> list[str]:
    """Return the trace's tenants, sorted."""
    return sorted({job.tenant for job in jobs})
