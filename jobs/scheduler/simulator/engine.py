"""The event loop: arrivals, completions and a scheduling pass after each batch of simultaneous events.

Virtual time only moves from event to event; nothing polls. A preempted job
goes back to the queue with its submission time and the work it has left
(it is assumed to checkpoint: its progress is kept).
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
    ProjectQuota,
    SchedulerConfig,
    Snapshot,
    TenantQuota,
    Workload,
)
from jobs.scheduler.frozen import schedule
from jobs.scheduler.simulator.build import POOL, core_nodes, pending_workload
from jobs.scheduler.simulator.metrics import Recorder, Result, check_quotas
from jobs.scheduler.simulator.traces import Trace, TraceJob

_ARRIVAL, _COMPLETION = 1, 0  # completions first at equal times: their GPUs are free for that pass


@dataclass(frozen=True, slots=True)
class Settings:
    """How a simulation runs: the policy, the minimum runtime before preemption, the quotas."""

    ordering: Ordering
    tenant_quotas: tuple[TenantQuota, ...]
    project_quotas: tuple[ProjectQuota, ...]
    min_runtime_s: float = 600.0


@dataclass
class _Running:
    workload: Workload
    finishes_at: float
    epoch: int


@dataclass
class _World:
    """What the simulated cluster holds now."""

    nodes: dict[str, Node]
    pending: dict[str, Workload] = field(default_factory=dict)
    running: dict[str, _Running] = field(default_factory=dict)
    remaining: dict[str, float] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Simulation:
    """Replays one trace under one policy; `run` returns the measured `Result`."""

    def __init__(self, trace: Trace, settings: Settings) -> None:
        self.trace = trace
        self.settings = settings
        self.config = SchedulerConfig(ordering=settings.ordering, min_runtime_s=settings.min_runtime_s, explain=False)
        self.jobs: dict[str, TraceJob] = {job.id: job for job in trace.jobs}
        self.world = _World(nodes={node.name: node for node in core_nodes(trace.nodes)})
        self.events: list[tuple[float, int, str]] = [(job.submitted_at, _ARRIVAL, job.id) for job in trace.jobs]
        heapq.heapify(self.events)
        capacity = sum(node.gpus for node in trace.nodes)
        self.recorder = Recorder(capacity, settings.tenant_quotas, self.jobs)

    def run(self) -> Result:
        """Return the metrics after every job has finished (or can never start)."""
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, kind, job_id = heapq.heappop(self.events)
                self._handle(now, kind, job_id)
            self._pass(now)
        return self.recorder.result(unfinished=len(self.world.pending))

    def _handle(self, now: float, kind: int, job_id: str) -> None:
        world = self.world
        if kind == _ARRIVAL:
            job = self.jobs[job_id]
            world.pending[job_id] = pending_workload(job)
            world.remaining[job_id] = job.duration_s
            self.recorder.arrived(job_id, now)
            return
        job_id, _, epoch = job_id.rpartition("#")
        running = world.running.get(job_id)
        if running is None or running.epoch != int(epoch):
            return  # preempted since: this completion is stale
        self._stop(running.workload)
        del world.running[job_id]
        self.recorder.finished(job_id, now)

    def _pass(self, now: float) -> None:
        world = self.world
        if not world.pending:
            self.recorder.sample(now, world.running.values(), world.pending.values())
            return
        snapshot = Snapshot(
            now=now,
            pools=(Pool(POOL),),
            nodes=tuple(world.nodes.values()),
            tenant_quotas=self.settings.tenant_quotas,
            project_quotas=self.settings.project_quotas,
            running=tuple(r.workload for r in world.running.values()),
            pending=tuple(world.pending.values()),
            config=self.config,
        )
        decisions = schedule(snapshot)
        self._apply(now, decisions)
        self.recorder.violations += check_quotas(
            snapshot, [r.workload for r in world.running.values()], self.settings.tenant_quotas
        )
        self.recorder.sample(now, world.running.values(), world.pending.values())

    def _apply(self, now: float, decisions: Decisions) -> None:
        world = self.world
        for preemption in decisions.preemptions:
            running = world.running.pop(preemption.victim)
            victim = running.workload
            world.remaining[victim.id] -= now - (victim.started_at or now)
            self._stop(victim)
            world.pending[victim.id] = replace(victim, started_at=None, allocation=())
            self.recorder.preempted(victim.id, now)
        for workload_id, allocation in decisions.placements.items():
            workload = replace(world.pending.pop(workload_id), started_at=now, allocation=allocation)
            self._start(workload)
            epoch = world.epochs[workload_id] = world.epochs[workload_id] + 1
            finishes = now + world.remaining[workload_id]
            world.running[workload_id] = _Running(workload, finishes, epoch)
            heapq.heappush(self.events, (finishes, _COMPLETION, f"{workload_id}#{epoch}"))
            self.recorder.started(workload_id, now)

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
