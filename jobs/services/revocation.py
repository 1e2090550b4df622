"""Stopping the work of people who lost access: removed members, deactivated accounts, deactivated tenants.

Access ends in the ledger first (the membership row goes, `is_active` turns
false); this module makes running work follow. `stop_orphaned_work` finds
every unfinished workload whose owner may no longer work in its tenant and
stops it through the same compare-and-swap stop as a user's cancel: a batch
job is cancelled, a notebook hibernated (its files kept for when access
returns), a queued notebook cancelled. Each stop writes the reason on the
workload ("Stopped: owner removed from tenant."), one audit event by the
system and one notification to the owner and the tenant's admins.

It is idempotent and cheap when there is nothing to do (one query): the
tenancy services ask for it on commit of the change that ended access
(`tenants.services.access.request_work_sweep`), and the controller runs it
every WORK_SWEEP_SECONDS to catch anything a lost trigger missed.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from jobs.choices import ACTIVE_STATES, ReasonCode, WorkloadKind, WorkloadState
from jobs.models import Workload
from jobs.services.hibernation import remember_lab_path
from jobs.services.stopping import stop_workload
from jobs.triggers import request_scheduling_pass
from notifications.services import notify_work_stopped
from tenants.context import SYSTEM
from tenants.models import Membership
from tenants.services.audit import record_audit_event

# Unfinished work that holds, or may soon hold, GPUs. Hibernated notebooks hold nothing and stay.
UNFINISHED_STATES: tuple[WorkloadState, ...] = (WorkloadState.PENDING, WorkloadState.PREEMPTED, *ACTIVE_STATES)
_HIBERNATE_FROM: tuple[WorkloadState, ...] = (WorkloadState.PREEMPTED, *ACTIVE_STATES)

TENANT_DEACTIVATED = "tenant deactivated"
OWNER_DEACTIVATED = "owner's account deactivated"
OWNER_REMOVED = "owner removed from tenant"


@dataclass(frozen=True)
class Stop:
    """How one workload is stopped: the state it goes to, from which states, and the words on it."""

    to_state: WorkloadState
    from_states: tuple[WorkloadState, ...]
    message: str


def orphaned_workloads() -> QuerySet[Workload]:
    """Return every unfinished workload whose owner may no longer work in its tenant, with owner and tenant.

    That is: its tenant is deactivated, its owner's account is deactivated,
    or its owner is no longer a member of the tenant (operators, who act in
    every tenant without a membership, excepted). One query.
    """
    member = Membership.all_tenants.filter(tenant_id=OuterRef("tenant_id"), user_id=OuterRef("owner_id"))
    operator = Q(owner__is_staff=True, owner__is_active=True)
    lost = Q(tenant__is_active=False) | Q(owner__is_active=False) | (~Exists(member) & ~operator)
    return Workload.all_tenants.filter(lost, state__in=UNFINISHED_STATES).select_related("owner", "tenant")


def why_stopped(workload: Workload) -> str:
    """Return why the platform stops `workload` (one of the three causes), most general cause first."""
    if not workload.tenant.is_active:
        return TENANT_DEACTIVATED
    if not workload.owner.is_active:
        return OWNER_DEACTIVATED
    return OWNER_REMOVED


def stop_for(workload: Workload, why: str) -> Stop:
    """Return how `workload` stops: a notebook that ran hibernates, anything else is cancelled."""
    if workload.kind == WorkloadKind.NOTEBOOK and workload.state in _HIBERNATE_FROM:
        return Stop(WorkloadState.HIBERNATED, _HIBERNATE_FROM, f"Hibernated: {why}. Its files are kept.")
    return Stop(WorkloadState.CANCELLED, UNFINISHED_STATES, f"Stopped: {why}.")


def stop_orphaned_work() -> int:
    """Stop every workload `orphaned_workloads` returns; return how many this call stopped.

    Each is stopped in its own transaction (a compare-and-swap: one that
    ended meanwhile, or that another sweep stopped first, is skipped), with
    its reason, an audit event and a notification. Safe to run any time and
    from several workers at once.
    """
    stopped = 0
    for workload in orphaned_workloads():
        if workload.kind == WorkloadKind.NOTEBOOK and workload.state == WorkloadState.RUNNING:
            remember_lab_path(workload)  # before the stop: Jupyter answers only while it runs
        stopped += _stop_one(workload)
    if stopped:
        request_scheduling_pass()
    return stopped


@transaction.atomic
def _stop_one(workload: Workload) -> bool:
    why = why_stopped(workload)
    stop = stop_for(workload, why)
    moved = stop_workload(
        workload_id=workload.pk,
        from_states=stop.from_states,
        to_state=stop.to_state,
        reason_code=ReasonCode.ACCESS_REVOKED,
        message=stop.message,
    )
    if not moved:
        return False
    record_audit_event(
        actor=SYSTEM,
        action="workload.stop_access_revoked",
        obj=workload,
        tenant_id=workload.tenant_id,
        before={"state": workload.state},
        after={"state": stop.to_state.value, "reason": why},
    )
    notify_work_stopped(
        tenant=workload.tenant,
        owner_id=workload.owner_id,
        workload_id=workload.pk,
        name=workload.name,
        workload_kind=workload.kind,
        state=stop.to_state.value,
        message=stop.message,
    )
    return True
