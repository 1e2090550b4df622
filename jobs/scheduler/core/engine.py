"""One scheduling pass: order pending work, place it all-or-nothing, preempt where the policy says, explain the rest.

Pools are independent (a workload names its pool), so each pool's pending
work is handled in turn, pools by name. Inside a pool, fair-share ordering
repeatedly serves the tenant furthest below its fair share (usage now over
fair share, plus its decayed past usage over its entitlement:
`priority.History`), inside it the project furthest below its own, and
inside that the workload with the highest priority, then the least planned
GPU-time aged by its wait (`priority.shortest_first`). A workload that does
not fit is skipped, not waited for, so idle GPUs are never held back, except
those reserved (below). The baselines: `fifo` stops at the first workload
that does not fit; `backfill` skips it, in submission order; `slurm` orders
by Slurm's multifactor priority (`priority.slurm_priority`) and reserves for
the first that does not fit.

Reservations (EASY backfill, `timeline.py`): one blocked workload per pool
gets the GPUs it will need at the earliest time running work is sure to have
freed them (by time limits). Work that would still run then may not take
those GPUs; work that ends by its limit before may. Under `fairshare` the
reservation goes to the workload that has waited longest past
`SchedulerConfig.starvation_s`, else to the first blocked gang that spans
nodes; under `slurm`, to the first blocked workload. After placement every
waiting workload gets a start-time estimate (`timeline.Estimator`).
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
from jobs.scheduler.core.estimates import estimate_pool
from jobs.scheduler.core.explain import Hints, capacity_detail, capacity_reason, message, quota_message
from jobs.scheduler.core.model import (
    Decisions,
    Estimate,
    Ordering,
    Preemption,
    Reason,
    ReplicaAllocation,
    Reservation,
    Snapshot,
    Waiting,
    Workload,
    lost_work,
    planned_run_s,
)
from jobs.scheduler.core.priority import shortest_first, slurm_priority
from jobs.scheduler.core.reclaim import Reclaimer
from jobs.scheduler.core.state import PassState, project_key
from jobs.scheduler.core.timeline import Hold, find_reservation, free_now

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
    if state.budgets:
        _stop_over_budget(state, snapshot.running)
    queues: dict[str, list[Workload]] = defaultdict(list)
    for workload in snapshot.pending:
        queues[workload.pool].append(workload)
    running: dict[str, list[Workload]] = defaultdict(list)
    for workload in snapshot.running:
        if workload.id not in state.preempted:
            running[workload.pool].append(workload)
    waiting: list[tuple[Workload, Reason, str, int]] = []
    reservations: list[Reservation] = []
    estimates: dict[str, Estimate] = {}
    for pool in sorted(queues):
        run = _PoolPass(state, pool, running.get(pool, []), waiting)
        if config.ordering is Ordering.FIFO:
            run.fifo(queues[pool])
        elif config.ordering is Ordering.BACKFILL:
            run.in_order(sorted(queues[pool], key=lambda w: (w.submitted_at, w.id)))
        elif config.ordering is Ordering.SLURM:
            run.in_order(_slurm_order(state, queues[pool]))
        else:
            run.fairshare(queues[pool])
        reservation = run.reservation()
        if reservation is not None:
            reservations.append(reservation)
        if config.estimates:
            estimates.update(run.estimates(reservation))
    return Decisions(
        placements=state.placements,
        preemptions=tuple(state.preemptions),
        waiting=_explain(state, waiting),
        fair_shares=dict(state.tenant_fair),
        reservations=tuple(reservations),
        estimates=estimates,
    )


def _slurm_order(state: PassState, queue: Sequence[Workload]) -> list[Workload]:
    """Return a pool's pending work by Slurm's multifactor priority, highest first (then submission, id)."""
    if not queue:
        return []
    pool = queue[0].pool
    capacity = state.capacity.get(pool)
    gpus = sum(capacity.capacity_by_model.values()) if capacity is not None else 0
    config, history, now = state.config, state.history, state.now

    def key(workload: Workload) -> tuple[float, float, str]:
        entitled = state.entitled.get((pool, workload.tenant, None), 0.0)
        return (-slurm_priority(workload, now, gpus, config, history, entitled), workload.submitted_at, workload.id)

    return sorted(queue, key=key)


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


def end_by_limit_now(workload: Workload, now: float) -> float:
    """Return when a pending workload started now would be killed at the latest (infinity without a limit)."""
    return now + workload.limit_s if workload.limit_s is not None else math.inf


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
        # Work placed this pass, with what it took: it runs from now on, as far as reservations are concerned.
        self.placed_now: list[tuple[Workload, tuple[Take, ...]]] = []
        # The reservation of this pool, once made: its holder, when and where, and the GPUs it keeps free now.
        self.holder: Workload | None = None
        self.hold: Hold | None = None
        self.held: list[Take] = []
        self.preempting = state.config.preemption and state.config.ordering is Ordering.FAIRSHARE
        self.reserving = state.config.reservations and state.config.ordering in (Ordering.SLURM, Ordering.FAIRSHARE)
        # Starving workloads tried before the fair-share order: skipped when their turn comes.
        self.started_first: set[str] = set()

    def fifo(self, queue: Sequence[Workload]) -> None:
        """Place in submission order and stop at the first workload that does not start."""
        ordered = sorted(queue, key=lambda w: (w.submitted_at, w.id))
        for number, workload in enumerate(ordered):
            if not self.attempt(workload):
                for behind in ordered[number + 1 :]:
                    self.wait(behind, Reason.BEHIND_QUEUE_HEAD, f"workload {workload.id}")
                return

    def in_order(self, ordered: Sequence[Workload]) -> None:
        """Place in the given order, skipping what does not fit (backfill); the first blocked may get a reservation."""
        for workload in ordered:
            self.attempt(workload)

    def fairshare(self, queue: Sequence[Workload]) -> None:
        """Serve the most under-served tenant, then project, then the best workload in it, until none is left."""
        now = self.state.now
        if self.reserving:
            self._reserve_for_starving(queue)
        self._express(queue)
        queues: dict[str, dict[str, list[Workload]]] = defaultdict(lambda: defaultdict(list))
        for workload in sorted(queue, key=lambda w: shortest_first(w, now)):
            queues[workload.tenant][workload.project].append(workload)
        cursors = {(t, p): 0 for t, projects in queues.items() for p in projects}
        tenants, projects = self._heaps(queues, cursors)
        while tenants:
            tenant = heapq.heappop(tenants)[-1]
            project = heapq.heappop(projects[tenant])[-1]
            cursor = cursors[(tenant, project)]
            cursors[(tenant, project)] = cursor + 1
            preemptions = len(self.state.preemptions)
            if queues[tenant][project][cursor].id not in self.started_first:
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
        state = self.state
        ratio = _ratio(state.tenant_usage[key], state.tenant_fair.get(key, 0.0))
        ratio += state.config.history_weight * state.history.ratio(head.pool, tenant)
        return (ratio, -head.priority, head.submitted_at, head.id, head, tenant)

    def _rank_project(self, tenant: str, project: str, head: Workload) -> Rank:
        key = (head.pool, tenant, project)
        state = self.state
        ratio = _ratio(state.project_usage[key], state.project_fair.get(key, 0.0))
        ratio += state.config.history_weight * state.history.ratio(head.pool, tenant, project)
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
        # Work that ends by its limit before the reservation starts (and the holder itself) may use its GPUs.
        free_to_use = self.hold is not None and (
            workload is self.holder or end_by_limit_now(workload, self.state.now) <= self.hold.start_at
        )
        if blocked is None:
            if free_to_use:
                takes = self._place_unheld(workload, models)
            else:
                takes = None if shape in self.failed else self._place(workload, models)
                if takes is None:
                    self.failed.add(shape)
        if takes is None and self.preempting:
            # Over its limit, only lower-priority work of its own project can make way (priority preemption).
            takes = self._preempt_for(workload, models, shape)
        if takes is None and blocked is not None:
            self.wait(workload, *blocked)
            return False
        if takes is None:
            reason = self._capacity_reason(workload, models)
            self.wait(workload, reason, capacity_detail(self.capacity, reason))
            if self.reserving and self.hold is None and self._deserves_reservation(workload):
                self._reserve(workload, models)
            return False
        self.state.record_placement(workload, takes)
        self.placed_now.append((workload, tuple(takes)))
        self.placed += 1
        self.placed_by_project[project_key(workload)] += 1
        return True

    def _deserves_reservation(self, workload: Workload) -> bool:
        """Return whether the first blocked workload gets the pool's reservation: any under slurm, gangs ours."""
        if self.state.config.ordering is Ordering.SLURM:
            return bool(workload.gpus)
        assert self.capacity is not None
        largest = max(self.capacity.largest_node_by_model.values(), default=0)
        return workload.gpus > 0 and workload.total_gpus > largest

    def _express(self, queue: Sequence[Workload]) -> None:
        """Try first, shortest first, the work planned to take at most `express_gpu_s` GPU-seconds.

        Such work costs any owner's fair share little and is most of what
        people wait on interactively: serving it before the fair-share order
        lowers the mean wait (measured in docs/scheduler.md).
        """
        limit, now = self.state.config.express_gpu_s, self.state.now
        if limit <= 0:
            return
        short = []
        for workload in queue:
            run = planned_run_s(workload)
            if run is not None and workload.id not in self.started_first and run * workload.total_gpus <= limit:
                short.append(workload)
        for workload in sorted(short, key=lambda w: shortest_first(w, now)):
            self.started_first.add(workload.id)
            self.attempt(workload)

    def _reserve_for_starving(self, queue: Sequence[Workload]) -> None:
        """Serve first the workload that has waited longest past `starvation_s`; reserve for it if it does not start.

        Rule-blocked workloads (limits, budgets, pool rules) are passed over:
        they wait for their owner, not for capacity. A few are tried, oldest first.
        """
        state = self.state
        oldest = state.now - state.config.starvation_s
        starving = sorted(
            (w for w in queue if w.submitted_at <= oldest and w.gpus), key=lambda w: (w.submitted_at, w.id)
        )
        for workload in starving[:8]:
            if self._blocked(workload) is not None or self.capacity is None:
                continue
            self.started_first.add(workload.id)  # attempted once: its place or its reason is recorded now
            if self.attempt(workload):
                continue
            models = self.capacity.accepted(workload.models)
            if self.hold is None and self._reserve(workload, models):
                return

    def _reserve(self, workload: Workload, models: tuple[str, ...]) -> bool:
        """Hold for `workload` the GPUs it will need when running work is sure to have freed them; return success."""
        assert self.capacity is not None
        running = [(w, self.capacity.takes_of(w)) for w in self.running if w.id not in self.state.preempted]
        excluded = self.capacity.mounts.excluded(workload.storage)
        hold = find_reservation(self.capacity, workload, models, running + self.placed_now, excluded)
        if hold is None:
            return False
        self.holder, self.hold = workload, hold
        self.held = free_now(self.capacity, hold)
        for take in self.held:
            self.capacity.occupy(take)
        return True

    def _place_unheld(self, workload: Workload, models: tuple[str, ...]) -> list[Take] | None:
        """Place with the reservation's GPUs available (the holder, or work ending before it), then hold the rest."""
        assert self.capacity is not None and self.hold is not None
        for take in reversed(self.held):
            self.capacity.give(take)
        try:
            return self._place(workload, models)
        finally:
            self.held = free_now(self.capacity, self.hold) if workload is not self.holder else []
            for take in self.held:
                self.capacity.occupy(take)

    def reservation(self) -> Reservation | None:
        """Return the pool's reservation (None when none was made, or its holder started this pass)."""
        if self.hold is None or self.holder is None or self.holder.id in self.state.placements:
            return None
        assert self.capacity is not None
        nodes = self.capacity.nodes
        by_node: dict[str, list[str]] = defaultdict(list)
        for take in self.hold.takes:
            by_node[nodes[take.node].name].extend(uuid for _, uuid in take.gpus)
        allocation = tuple(ReplicaAllocation(node, tuple(gpus)) for node, gpus in by_node.items())
        return Reservation(self.holder.id, self.holder.pool, self.hold.start_at, allocation)

    def estimates(self, reservation: Reservation | None) -> dict[str, Estimate]:
        """Return start-time estimates for this pool's waiting work (`estimates.estimate_pool`)."""
        if self.capacity is None:
            return {}
        for take in reversed(self.held):
            self.capacity.give(take)  # reserved GPUs are free now: the estimate counts them as such
        self.held = []
        running = [w for w in self.running if w.id not in self.state.preempted]
        started = [w for w, _ in self.placed_now]
        mine = [(w, reason) for w, reason, _, _ in self.waiting if w.pool == (self.pool.name if self.pool else "")]
        return estimate_pool(self.state, self.capacity, running, started, mine, reservation)

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

    def _place(self, workload: Workload, models: tuple[str, ...], *, probe: bool = False) -> list[Take] | None:
        capacity = self.capacity
        assert capacity is not None  # only called for open pools
        if workload.gpus and (
            capacity.free_gpus(models) < workload.total_gpus or capacity.largest_free(models) < workload.gpus
        ):
            return None  # counts alone rule it out: no search
        excluded = capacity.mounts.excluded(workload.storage)
        takes = capacity.place_gang(
            models, workload.gpus, workload.replicas, workload.cpu_milli, workload.memory_mib, excluded
        )
        if probe and takes is not None:
            for take in reversed(takes):
                capacity.give(take)
        return takes

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
        if self.state.config.ordering is not Ordering.FAIRSHARE:
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
