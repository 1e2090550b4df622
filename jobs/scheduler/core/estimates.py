"""Start-time estimates for the work a pass leaves waiting in one pool.

- Work waiting for capacity (or behind the queue's head) is estimated in
  queue order by `timeline.Estimator`: running work frees its GPUs at its
  planned end, and each waiting workload starts once enough are free.
- The reservation's holder starts no later than its reservation.
- Work over its owner's limit starts when enough of its owner's own running
  work has ended (`timeline.earliest_start` on the owner's headroom).
- Work held back by rules (a used-up budget, a cordoned, unknown or
  dedicated pool, a model or storage the pool never has) gets no estimate:
  nothing in the plan says when that changes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from jobs.scheduler.core.capacity import PoolCapacity
from jobs.scheduler.core.model import Estimate, Reason, Reservation, Workload
from jobs.scheduler.core.state import PassState, project_key, tenant_key
from jobs.scheduler.core.timeline import Estimator, earliest_start, planned_end

IN_QUEUE = (
    "Assumes running work ends when predicted from similar past work (else at its time limit) and the work "
    "ahead of it in the queue starts first; work that arrives later with a better claim can move it back."
)
RESERVED = "GPUs are reserved for it from then: the work running on them is stopped by its time limit at the latest."
OVER_LIMIT = (
    "Its owner is at its GPU limit: assumes the owner's running work ends when predicted (else at its time limit)."
)

_NO_ESTIMATE = frozenset(
    {
        Reason.BUDGET,
        Reason.POOL_CORDONED,
        Reason.UNKNOWN_POOL,
        Reason.DEDICATED_POOL,
        Reason.NO_CAPACITY_FOR_MODEL,
        Reason.NO_STORAGE,
    }
)


def estimate_pool(
    state: PassState,
    capacity: PoolCapacity,
    running: Sequence[Workload],
    started: Sequence[Workload],
    waiting: Sequence[tuple[Workload, Reason]],
    reservation: Reservation | None,
) -> dict[str, Estimate]:
    """Return an estimate per waiting workload id that has one; `waiting` is in queue order.

    `running` is what runs in the pool after this pass's preemptions;
    `started` what this pass placed (it runs from `state.now`).
    """
    now = state.now
    from_now = [_started_now(w, now) for w in started]
    everything = [*running, *from_now]
    total = sum(capacity.capacity_by_model.values())
    estimator = Estimator(now, capacity.free_gpus(capacity.models), total, everything)
    estimates: dict[str, Estimate] = {}
    owners: _OwnerEnds | None = None  # built when the first workload over its limit needs it
    for workload, reason in waiting:
        if reason in _NO_ESTIMATE or not workload.gpus:
            continue
        if reason is Reason.QUOTA_LIMIT:
            if owners is None:
                owners = _OwnerEnds(now, everything)
            start = _after_owner_frees(state, workload, owners)
            basis = OVER_LIMIT
        else:
            start, basis = estimator.next_start(workload), IN_QUEUE
        if reservation is not None and reservation.workload == workload.id and reservation.start_at <= start:
            start, basis = reservation.start_at, RESERVED
        if not math.isinf(start):
            estimates[workload.id] = Estimate(max(start, now), basis)
    return estimates


def _started_now(workload: Workload, now: float) -> Workload:
    return replace(workload, started_at=now)


class _OwnerEnds:
    """Planned ends of running work grouped by tenant and by project, built once per pool."""

    def __init__(self, now: float, running: Sequence[Workload]) -> None:
        self.by_tenant: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
        self.by_project: dict[tuple[str, str, str], list[tuple[float, int]]] = defaultdict(list)
        for workload in running:
            end = (planned_end(workload, now), workload.total_gpus)
            self.by_tenant[tenant_key(workload)].append(end)
            self.by_project[project_key(workload)].append(end)


def _after_owner_frees(state: PassState, workload: Workload, ends: _OwnerEnds) -> float:
    """Return when the workload's tenant and project have room under their limits, by their work's planned ends."""
    now, need = state.now, workload.total_gpus
    tenant, project = tenant_key(workload), project_key(workload)
    tenant_room = state.tenant_quota(tenant).limit - state.tenant_usage[tenant]
    project_room = state.project_quota(project).limit - state.project_usage[project]
    return max(
        earliest_start(now, int(tenant_room), need, ends.by_tenant.get(tenant, ())),
        earliest_start(now, int(project_room), need, ends.by_project.get(project, ())),
    )
