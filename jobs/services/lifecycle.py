"""State changes of workloads: compare-and-swap, one event per transition.

`transition_workload` is the one way any code (services, the scheduler's
tasks, reconcile) moves a single workload between states: it changes the
row only if it is still in one of the expected states, so two workers racing
on the same workload cannot both win, and it writes the event in the same
transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from gpucloud.errors import Conflict
from jobs.choices import ReasonCode, WorkloadState, can_transition
from jobs.models import Allocation, Workload, WorkloadEvent
from jobs.triggers import request_scheduling_pass
from tenants.choices import Role
from tenants.context import Actor
from tenants.services.access import require_role
from tenants.services.audit import record_audit_event

CANCELLABLE_STATES: tuple[WorkloadState, ...] = (
    WorkloadState.PENDING,
    WorkloadState.SCHEDULED,
    WorkloadState.STARTING,
    WorkloadState.RUNNING,
    WorkloadState.PREEMPTED,
)


@transaction.atomic
def transition_workload(
    *,
    workload_id: int,
    from_states: Iterable[WorkloadState | str],
    to_state: WorkloadState | str,
    reason_code: str = "",
    message: str = "",
    **fields: Any,
) -> bool:
    """Move the workload to `to_state` if it is in one of `from_states`; return whether it moved.

    Also sets the reason and any extra model `fields`, and writes one
    `workload.state_changed` event. Returns False, changing nothing, when
    the row is in another state (someone else moved it first) or gone.
    Raises ValueError when a listed source state cannot reach `to_state`:
    that is a bug in the caller, not a race.
    """
    target = WorkloadState(to_state)
    sources = [WorkloadState(state) for state in from_states]
    illegal = [str(state) for state in sources if not can_transition(state, target)]
    if illegal:
        raise ValueError(f"workloads cannot go from {', '.join(illegal)} to {target}")
    row = (
        Workload.all_tenants.select_for_update()
        .filter(pk=workload_id, state__in=sources)
        .values("tenant_id", "state")
        .first()
    )
    if row is None:
        return False
    now = timezone.now()
    changes = {"reason_code": reason_code, "reason_message": message, "updated_at": now, **fields}
    moved = Workload.all_tenants.filter(pk=workload_id, state=row["state"]).update(state=target, **changes)
    if moved != 1:
        return False
    WorkloadEvent.all_tenants.create(
        tenant_id=row["tenant_id"],
        workload_id=workload_id,
        kind="workload.state_changed",
        from_state=row["state"],
        to_state=target,
        reason_code=reason_code,
        message=message,
        created_at=now,
    )
    return True


def release_allocations(*, workload_id: int) -> int:
    """Mark the workload's active allocations released now; return how many were. Idempotent."""
    return Allocation.all_tenants.filter(workload_id=workload_id, released_at__isnull=True).update(
        released_at=timezone.now()
    )


@transaction.atomic
def cancel_workload(*, actor: Actor, workload: Workload) -> Workload:
    """Cancel `workload`, free its GPUs, and return it reloaded.

    Members cancel their own workloads, tenant admins any in the tenant.
    Raises PermissionDenied, Http404, or Conflict (`illegal_transition`, with
    `current_state`) when the workload has already ended.
    """
    role = require_role(actor, workload.tenant, Role.MEMBER)
    if not role.at_least(Role.ADMIN) and (actor.user is None or workload.owner_id != actor.user.pk):
        raise PermissionDenied("Members can cancel only their own workloads.")
    before = workload.state
    cancelled = transition_workload(
        workload_id=workload.pk,
        from_states=CANCELLABLE_STATES,
        to_state=WorkloadState.CANCELLED,
        reason_code=ReasonCode.CANCELLED_BY_USER,
        message=f"Cancelled by {actor.label}.",
        finished_at=timezone.now(),
        queue_position=None,
    )
    current = Workload.all_tenants.select_related("project", "pool", "owner").get(pk=workload.pk)
    if not cancelled:
        raise Conflict(
            f"Workload {current.name} is {current.state}; only unfinished workloads can be cancelled.",
            code="illegal_transition",
            details={"current_state": current.state, "requested_state": WorkloadState.CANCELLED.value},
        )
    released = release_allocations(workload_id=workload.pk)
    record_audit_event(
        actor=actor,
        action="workload.cancel",
        obj=current,
        tenant_id=current.tenant_id,
        before={"state": before},
        after={"state": current.state, "released_allocations": released},
    )
    request_scheduling_pass()
    return current
