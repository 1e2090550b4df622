"""What users do to their workloads: cancel (or stop) and restart.

Members act on their own workloads, tenant admins on any in the tenant;
viewers never. Every action is audited.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from common.errors import Conflict
from jobs.choices import ACTIVE_STATES, TERMINAL_STATES, ReasonCode, WorkloadState
from jobs.models import Allocation, Workload
from jobs.services import images
from jobs.services import quota_rules as rules
from jobs.services.lifecycle import next_attempt_fields, transition_workload
from jobs.services.spec import WorkloadSpec
from jobs.services.stopping import stop_workload
from jobs.triggers import request_scheduling_pass
from tenants.choices import Role
from tenants.context import Actor
from tenants.scoping import tenant_scope
from tenants.services.access import require_role
from tenants.services.audit import record_audit_event

CANCELLABLE_STATES: tuple[WorkloadState, ...] = (
    WorkloadState.PENDING,
    WorkloadState.SCHEDULED,
    WorkloadState.STARTING,
    WorkloadState.RUNNING,
    WorkloadState.PREEMPTED,
    WorkloadState.HIBERNATED,
)
RESTARTABLE_STATES: tuple[WorkloadState, ...] = (*TERMINAL_STATES, WorkloadState.PREEMPTED)
# Cancelling one of these stops its replicas first (the pages call it Stop).
STARTED_STATES: tuple[WorkloadState, ...] = (WorkloadState.STARTING, WorkloadState.RUNNING)
# Only notebooks hibernate, from any state that holds GPUs.
HIBERNATABLE_STATES: tuple[WorkloadState, ...] = tuple(ACTIVE_STATES)


def may_act(role: Role, *, owner_id: int, viewer_id: int | None) -> bool:
    """Return whether a viewer with `role` (and user id `viewer_id`) may act on a workload of `owner_id`:
    members on their own, tenant admins and operators on any, viewers never."""
    mine = viewer_id is not None and owner_id == viewer_id
    return role.at_least(Role.MEMBER) and (role.at_least(Role.ADMIN) or mine)


def require_actor(actor: Actor, workload: Workload) -> None:
    """Raise Http404 or PermissionDenied unless `actor` may act on `workload`: its owner (a member), or an admin."""
    role = require_role(actor, workload.tenant, Role.MEMBER)
    if not may_act(role, owner_id=workload.owner_id, viewer_id=actor.user.pk if actor.user is not None else None):
        raise PermissionDenied("Members can act only on their own workloads.")


def check_rules_again(workload: Workload) -> None:
    """Apply the submission rules that may have changed since: allowed images, the quota, count limits.

    Raises ValidationError naming the field and rule, as a submission would.
    """
    spec = WorkloadSpec(
        name=workload.name,
        image=workload.image,
        pool=workload.pool,
        kind=workload.kind,
        gpus_per_replica=workload.gpus_per_replica,
        replicas=workload.replicas,
    )
    images.check_images([spec], workload.tenant_id, bulk=False)
    limits = rules.lock_limits(workload.project, [workload.pool])
    rules.check_gpu_limit(spec, limits[workload.pool.pk], workload.project)
    rules.check_counts([spec], limits, workload.project, workload.owner)


def _illegal(current: Workload, requested: WorkloadState, rule: str) -> Conflict:
    return Conflict(
        f"Workload {current.name} is {current.state}; {rule}.",
        code="illegal_transition",
        details={"current_state": current.state, "requested_state": requested.value},
    )


def reloaded(workload: Workload) -> Workload:
    """Return `workload` read again with its project, pool, owner and tenant, as an action answers it.

    Reads under the workload's own tenant scope, whatever scope (if any) the caller runs in.
    """
    with tenant_scope(workload.tenant):
        return Workload.objects.select_related("project", "pool", "owner", "tenant").get(pk=workload.pk)


def still_stopping(workload: Workload) -> bool:
    """Return whether an earlier attempt of `workload` still holds GPUs (an allocation not yet released)."""
    with tenant_scope(workload.tenant):
        return Allocation.objects.filter(workload_id=workload.pk, released_at__isnull=True).exists()


def record_action(*, actor: Actor, action: str, workload: Workload, before: str, new_attempt: bool = False) -> None:
    """Audit `actor`'s `action` on `workload` (its state `before` -> now; with `new_attempt`, the attempt too)
    and ask for a scheduling pass: GPUs come free, or work joins the queue."""
    old: dict[str, str | int] = {"state": before}
    new: dict[str, str | int] = {"state": workload.state}
    if new_attempt:
        old["attempt"], new["attempt"] = workload.attempt - 1, workload.attempt
    record_audit_event(actor=actor, action=action, obj=workload, tenant_id=workload.tenant_id, before=old, after=new)
    request_scheduling_pass()


@transaction.atomic
def cancel_workload(*, actor: Actor, workload: Workload) -> Workload:
    """Cancel `workload` (stop it, with its grace period, when it runs) and return it reloaded.

    Its GPUs are freed once its node confirms the replicas stopped (at once
    when nothing was launched). Raises PermissionDenied, Http404, or
    Conflict (`illegal_transition`, with `current_state`) when it has ended.
    """
    require_actor(actor, workload)
    before = workload.state
    running = before in STARTED_STATES
    verb = "Stopped" if running else "Cancelled"
    moved = stop_workload(
        workload_id=workload.pk,
        from_states=CANCELLABLE_STATES,
        to_state=WorkloadState.CANCELLED,
        reason_code=ReasonCode.STOPPED_BY_USER if running else ReasonCode.CANCELLED_BY_USER,
        message=f"{verb} by {actor.label}.",
    )
    current = reloaded(workload)
    if not moved:
        raise _illegal(current, WorkloadState.CANCELLED, "only unfinished workloads can be cancelled")
    record_action(actor=actor, action="workload.cancel", workload=current, before=before)
    return current


@transaction.atomic
def restart_workload(*, actor: Actor, workload: Workload) -> Workload:
    """Queue an ended workload again as a new attempt (same spec, a new place in the queue); return it reloaded.

    The submission rules that can change meanwhile apply again (allowed
    images, the project's quota and count limits). Raises PermissionDenied,
    Http404, ValidationError (a rule, as at submission), or Conflict:
    `illegal_transition` when it has not ended, `still_stopping` while its
    last attempt still holds GPUs.
    """
    require_actor(actor, workload)
    if still_stopping(workload):
        raise Conflict(
            f"Workload {workload.name} is still stopping; restart it once its GPUs are released.",
            code="still_stopping",
        )
    check_rules_again(workload)
    before = workload.state
    now = timezone.now()
    moved = transition_workload(
        workload_id=workload.pk,
        from_states=RESTARTABLE_STATES,
        to_state=WorkloadState.PENDING,
        reason_code=ReasonCode.RESTARTED,
        message=f"Restarted by {actor.label} as attempt {workload.attempt + 1}.",
        submitted_at=now,
        **next_attempt_fields(),
    )
    current = reloaded(workload)
    if not moved:
        raise _illegal(current, WorkloadState.PENDING, "only ended workloads can be restarted")
    record_action(actor=actor, action="workload.restart", workload=current, before=before, new_attempt=True)
    return current
