"""One scheduling pass: order pending work, place it all-or-nothing, preempt where the policy says, explain the rest.

Pools are independent (a workload names its pool), so each pool's pending
work is handled in turn, pools by name. Inside a pool, fair-share ordering
repeatedly serves the tenant furthest below its fair share, inside it the
project furthest below its own, and inside that the workload with the highest
priority, then the earliest submission, then the smallest id. A workload that
does not fit is skipped, not waited for, so idle GPUs are never held back;
the FIFO ordering (a baseline) stops at the first workload that does not fit.
A workload that mounts volumes is only searched for on the nodes that can
mount them (`storage.py`). Before any of it, running work whose owner's
used-up budget stops running work is preempted, and a used-up budget holds
back its owner's pending work like a pool rule (`budgets.py`).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Sequence

from jobs.scheduler.core.budgets import owner_of, used_up
from jobs.scheduler.core.capacity import PoolCapacity, Take
from jobs.scheduler.core.explain import Hints, capacity_detail, capacity_reason, message, quota_message
from jobs.scheduler.core.model import Decisions, Ordering, Preemption, Reason, Snapshot, Waiting, Workload, lost_work
from jobs.scheduler.core.reclaim import Reclaimer
from jobs.scheduler.core.state import PassState, project_key

# Reasons about the pool's free capacity: the ones a hint ("would start now ...") can help with.
_CAPACITY_REASONS = frozenset(
    {
        Reason.NO_CAPACITY,
        Reason.NO_CAPACITY_FOR_MODEL,
        Reason.GANG_CANNOT_FIT,
        Reason.WAITING_FOR_FAIRER_WORK,
        Reason.NO_STORAGE,
    }
)

# What identifies a request for capacity: accepted models, GPUs per replica, replicas, CPU, memory, storage.
Shape = tuple[tuple[str, ...], int, int, int, int, frozenset[str]]

# A heap entry: (usage / fair share, -priority, submitted_at, id) of the owner's best workload, it, and the owner.
Rank = tuple[float, int, float, str, Workload, str]


def schedule(snapshot: Snapshot) -> Decisions:
    """Return the decisions of one pass over `snapshot`; the same snapshot always gives the same decisions."""
    state = PassState(snapshot)
    config = snapshot.config
    preempting = config.preemption and config.ordering is Ordering.FAIRSHARE
    if state.budgets:
        _stop_over_budget(state, snapshot.running)
    queues: dict[str, list[Workload]] = defaultdict(list)
    for workload in snapshot.pending:
        queues[workload.pool].append(workload)
    running: dict[str, list[Workload]] = defaultdict(list)
    if preempting:
        for workload in snapshot.running:
            if workload.id not in state.preempted:
                running[workload.pool].append(workload)
    waiting: list[tuple[Workload, Reason, str, int]] = []
    for pool in sorted(queues):
        run = _PoolPass(state, pool, running.get(pool, []), waiting)
        if config.ordering is Ordering.FIFO:
            run.fifo(queues[pool])
        else:
            run.fairshare(queues[pool])
    return Decisions(
        placements=state.placements,
        preemptions=tuple(state.preemptions),
        waiting=_explain(state, waiting),
        fair_shares=dict(state.tenant_fair),
    )


def _stop_over_budget(state: PassState, running: Sequence[Workload]) -> None:
    """Preempt every running workload whose owner's used-up budget stops running work (`budgets.py`).

    A hard cap, not fairness: it stops work of any age, preemption on or off.
    The GPUs stay taken for this pass: the victims hold them until their
    nodes confirm they stopped, and a later pass gives them out.
    """
    for workload in sorted(running, key=lambda w: w.id):
        budget = state.budgets.stopping(workload)
        if budget is None:
            continue
        state.preempted.add(workload.id)
        state.charge(workload, -1)
        detail = f"{used_up(budget)}: {owner_of(budget)} runs nothing until the budget is raised or its period ends."
        state.preemptions.append(Preemption(workload.id, Reason.BUDGET, "", lost_work(workload, state.now), detail))


def _explain(state: PassState, waiting: list[tuple[Workload, Reason, str, int]]) -> dict[str, Waiting]:
    if not state.config.explain:
        return {w.id: Waiting(reason, "", position) for w, reason, _, position in waiting}
    hints = Hints(state)
    explained: dict[str, Waiting] = {}
    for workload, reason, detail, position in waiting:
        found = hints.hint(workload, reason) if reason in _CAPACITY_REASONS else None
        explained[workload.id] = Waiting(reason, message(reason, workload, detail), position, found)
    return explained


def _shape(workload: Workload, models: tuple[str, ...]) -> Shape:
    return (models, workload.gpus, workload.replicas, workload.cpu_milli, workload.memory_mib, workload.storage)


def _sort_key(workload: Workload) -> tuple[int, float, str]:
    return (-workload.priority, workload.submitted_at, workload.id)


class _PoolPass:
    """The pass over one pool's pending work."""

    def __init__(
        self, state: PassState, pool: str, running: list[Workload], waiting: list[tuple[Workload, Reason, str, int]]
    ) -> None:
        self.state = state
        self.pool = state.pools.get(pool)
        self.capacity: PoolCapacity | None = state.capacity.get(pool)
        self.running = running
        self._reclaimer: Reclaimer | None = None
        self.waiting = waiting
        self.position = 0
        self.placed = 0
        self.placed_by_project: dict[tuple[str, str, str], int] = defaultdict(int)
        # Within a pass free capacity only shrinks (until a preemption), so a shape that failed fails again.
        self.failed: set[Shape] = set()
        self.reclaim_failed: set[tuple[Shape, str, str, int]] = set()
        self.reasons: dict[tuple[Shape, int, int], tuple[Reason, bool]] = {}

    def fifo(self, queue: Sequence[Workload]) -> None:
        """Place in submission order and stop at the first workload that does not start."""
        ordered = sorted(queue, key=lambda w: (w.submitted_at, w.id))
        for number, workload in enumerate(ordered):
            if not self.attempt(workload):
                for behind in ordered[number + 1 :]:
                    self.wait(behind, Reason.BEHIND_QUEUE_HEAD, f"workload {workload.id}")
                return

    def fairshare(self, queue: Sequence[Workload]) -> None:
        """Serve the most under-served tenant, then project, then the best workload in it, until none is left."""
        queues: dict[str, dict[str, list[Workload]]] = defaultdict(lambda: defaultdict(list))
        for workload in sorted(queue, key=_sort_key):
            queues[workload.tenant][workload.project].append(workload)
        cursors = {(t, p): 0 for t, projects in queues.items() for p in projects}
        tenants, projects = self._heaps(queues, cursors)
        while tenants:
            tenant = heapq.heappop(tenants)[-1]
            project = heapq.heappop(projects[tenant])[-1]
            cursor = cursors[(tenant, project)]
            cursors[(tenant, project)] = cursor + 1
            preemptions = len(self.state.preemptions)
            self.attempt(queues[tenant][project][cursor])
            if len(self.state.preemptions) != preemptions:
                # Victims' owners lost usage: every rank may have moved.
                tenants, projects = self._heaps(queues, cursors)
                continue
            items = queues[tenant][project]
            if cursor + 1 < len(items):
                heapq.heappush(projects[tenant], self._rank_project(tenant, project, items[cursor + 1]))
            if projects[tenant]:
                heapq.heappush(tenants, self._rank_tenant(tenant, projects[tenant][0][-2]))

    def _heaps(
        self, queues: dict[str, dict[str, list[Workload]]], cursors: dict[tuple[str, str], int]
    ) -> tuple[list[Rank], dict[str, list[Rank]]]:
        projects: dict[str, list[Rank]] = {}
        for tenant, by_project in queues.items():
            heap = [
                self._rank_project(tenant, project, items[cursors[(tenant, project)]])
                for project, items in by_project.items()
                if cursors[(tenant, project)] < len(items)
            ]
            heapq.heapify(heap)
            projects[tenant] = heap
        tenants = [self._rank_tenant(tenant, heap[0][-2]) for tenant, heap in projects.items() if heap]
        heapq.heapify(tenants)
        return tenants, projects

    def _rank_tenant(self, tenant: str, head: Workload) -> Rank:
        key = (head.pool, tenant)
        ratio = _ratio(self.state.tenant_usage[key], self.state.tenant_fair.get(key, 0.0))
        return (ratio, -head.priority, head.submitted_at, head.id, head, tenant)

    def _rank_project(self, tenant: str, project: str, head: Workload) -> Rank:
        key = (head.pool, tenant, project)
        ratio = _ratio(self.state.project_usage[key], self.state.project_fair.get(key, 0.0))
        return (ratio, -head.priority, head.submitted_at, head.id, head, project)

    def attempt(self, workload: Workload) -> bool:
        """Place the workload (preempting if the policy allows) and return True, or record why it waits."""
        blocked = self._blocked(workload)
        if blocked is not None and blocked[0] is not Reason.QUOTA_LIMIT:
            self.wait(workload, *blocked)
            return False
        assert self.capacity is not None  # _blocked refuses unknown and cordoned pools
        models = self.capacity.accepted(workload.models)
        shape = _shape(workload, models)
        takes = None
        if blocked is None:
            takes = None if shape in self.failed else self._place(workload, models)
            if takes is None:
                self.failed.add(shape)
        if takes is None:
            # Over its limit, only lower-priority work of its own project can make way (priority preemption).
            takes = self._preempt_for(workload, models, shape)
        if takes is None and blocked is not None:
            self.wait(workload, *blocked)
            return False
        if takes is None:
            reason = self._capacity_reason(workload, models)
            self.wait(workload, reason, capacity_detail(self.capacity, reason))
            return False
        self.state.record_placement(workload, takes)
        self.placed += 1
        self.placed_by_project[project_key(workload)] += 1
        return True

    def _blocked(self, workload: Workload) -> tuple[Reason, str] | None:
        if self.pool is None:
            return (Reason.UNKNOWN_POOL, "")
        if self.pool.cordoned:
            return (Reason.POOL_CORDONED, "")
        if self.pool.dedicated_tenant not in (None, workload.tenant):
            return (Reason.DEDICATED_POOL, "")
        state, gpus = self.state, workload.total_gpus
        if state.budgets:
            held = state.budgets.blocks(state, workload, workload.pool)
            if held is not None:
                return (Reason.BUDGET, held)
        tenant, project = (workload.pool, workload.tenant), project_key(workload)
        # The common case first, without building a sentence.
        if (
            state.tenant_usage[tenant] + gpus <= state.tenant_quota(tenant).limit
            and state.project_usage[project] + gpus <= state.project_quota(project).limit
        ):
            return None
        over = quota_message(state, workload)
        return None if over is None else (Reason.QUOTA_LIMIT, over)

    def _place(self, workload: Workload, models: tuple[str, ...]) -> list[Take] | None:
        capacity = self.capacity
        assert capacity is not None  # only called for open pools
        if workload.gpus and (
            capacity.free_gpus(models) < workload.total_gpus or capacity.largest_free(models) < workload.gpus
        ):
            return None  # counts alone rule it out: no search
        excluded = capacity.mounts.excluded(workload.storage)
        return capacity.place_gang(
            models, workload.gpus, workload.replicas, workload.cpu_milli, workload.memory_mib, excluded
        )

    def _preempt_for(self, workload: Workload, models: tuple[str, ...], shape: Shape) -> list[Take] | None:
        if not self.running or not workload.gpus or self.capacity is None:
            return None
        key = (shape, workload.tenant, workload.project, workload.priority)
        if key in self.reclaim_failed:
            return None
        if self._reclaimer is None:
            self._reclaimer = Reclaimer(self.state, self.capacity, self.running)
        takes = self._reclaimer.make_room(workload, models)
        if takes is None:
            self.reclaim_failed.add(key)
        else:
            # Victims freed capacity: earlier failures may fit now.
            self.failed.clear()
            self.reclaim_failed.clear()
        return takes

    def _capacity_reason(self, workload: Workload, models: tuple[str, ...]) -> Reason:
        assert self.capacity is not None  # only called for open pools
        # Free capacity changes only when something is placed or preempted: the base reason is cached until then.
        key = (_shape(workload, models), self.placed, len(self.state.preemptions))
        cached = self.reasons.get(key)
        if cached is None:
            # Room at the start of the pass counts only where its volumes can be mounted: a node that cannot
            # mount them had no room for it, whatever was placed there since.
            initially = (
                bool(workload.gpus)
                and not self.capacity.mounts.excluded(workload.storage)
                and self.capacity.initially_fits(models, workload.gpus, workload.replicas)
            )
            cached = self.reasons[key] = (capacity_reason(self.capacity, workload, models), initially)
        reason, initially = cached
        if reason in (Reason.NO_CAPACITY_FOR_MODEL, Reason.NO_STORAGE) or not initially or not self.placed:
            return reason
        if self.state.config.ordering is Ordering.FIFO:
            return reason
        if self.state.placed_priority.get(project_key(workload), workload.priority) > workload.priority:
            return Reason.WAITING_FOR_HIGHER_PRIORITY
        if self.placed > self.placed_by_project[project_key(workload)]:
            return Reason.WAITING_FOR_FAIRER_WORK
        return reason  # only earlier work of its own project went ahead

    def wait(self, workload: Workload, reason: Reason, detail: str = "") -> None:
        """Record that the workload waits, at the next position of its pool's queue."""
        self.position += 1
        self.waiting.append((workload, reason, detail, self.position))


def _ratio(usage: float, fair: float) -> float:
    # How far below its fair share an owner is: usage over entitlement, smaller is more under-served.
    return usage / fair if fair > 0 else math.inf
