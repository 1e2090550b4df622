"""Idle notebook reclaim: notice activity, warn the owner, then stop the notebook and free its GPUs.

A running notebook is active while any GPU it holds works at or above
NOTEBOOK_IDLE_UTILIZATION percent (in its latest heartbeat sample, or at
its peak in any per-minute rollup of the last TELEMETRY_IDLE_WINDOW_SECONDS
while the notebook held it: a burst between two checks counts), or while
its Jupyter server has a busy kernel or reports activity newer than the
last seen (API use, kernel output, terminals). An open browser tab alone is
not activity: a tab left open overnight must not hold GPUs.

`Workload.last_activity_at` is the last activity seen (the session's start
counts). The idle clock runs from the later of it and the owner's one
extension (`idle_extended_at`). At (timeout - NOTEBOOK_IDLE_WARNING_SECONDS)
idle the owner is warned once (`idle_warned_at` and a `workload.idle_warning`
event); activity clears the warning; once idle for the whole timeout, and
at least the warning period after the warning (so the time a warning
announces always holds, even after the controller was down), the notebook
is stopped through `stop_workload` with reason IDLE. Maximum runtime is not
enforced here: it applies to every workload and lives with the other stops.
"""

from __future__ import annotations

import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Exists, Q
from django.utils import timezone

from common.errors import Conflict
from inventory.selectors import minute_start
from jobs.choices import ReasonCode, WorkloadKind, WorkloadState
from jobs.jupyter import ActivitySource, JupyterActivity, JupyterClient, JupyterUnavailable
from jobs.models import Allocation, Replica, Workload, WorkloadEvent
from jobs.selectors import minutes_while_held
from jobs.services.actions import may_act
from jobs.services.stopping import stop_workload
from notifications.services import notify_idle_warning
from tenants.choices import Role
from tenants.context import Actor
from tenants.scoping import tenant_scope
from tenants.services.access import require_role
from tenants.services.audit import record_audit_event

log = logging.getLogger(__name__)

# Jupyter servers asked at once: each answers within the client's timeout, so a hung one delays the rest little.
PROBE_THREADS = 8


def idle_timeout_seconds(workload: Workload) -> int:
    """Return the notebook's idle timeout: its own, else its tenant's, else NOTEBOOK_IDLE_TIMEOUT_SECONDS."""
    for seconds in (workload.idle_timeout_seconds, workload.tenant.notebook_idle_timeout_seconds):
        if seconds:
            return seconds
    return int(settings.NOTEBOOK_IDLE_TIMEOUT_SECONDS)


def _duration(seconds: float) -> str:
    """Return a whole-minute duration as people say it: "1 minute", "50 minutes", "2 hours 5 minutes"."""
    minutes = max(int(seconds // 60), 0)
    if minutes < 120:
        return f"{minutes} minute{'' if minutes == 1 else 's'}"
    hours, rest = divmod(minutes, 60)
    return f"{hours} hours" + (f" {rest} minute{'' if rest == 1 else 's'}" if rest else "")


def _busy_on_gpu(workload_ids: list[int], *, now: datetime) -> set[int]:
    """Return which workloads hold a GPU busy at or above the idle threshold, now or lately.

    Busy: the GPU's latest sample is at or above it, or its peak is in a
    rollup minute of the last TELEMETRY_IDLE_WINDOW_SECONDS from the minute
    the workload took the GPU on. One query.
    """
    threshold = float(settings.NOTEBOOK_IDLE_UTILIZATION)
    since = minute_start(now - timedelta(seconds=settings.TELEMETRY_IDLE_WINDOW_SECONDS))
    busy_minutes = minutes_while_held().filter(minute__gte=since, minute__lte=now, utilization_max__gte=threshold)
    held = Allocation.all_tenants.filter(workload_id__in=workload_ids, released_at__isnull=True, gpu__isnull=False)
    busy = held.filter(Q(gpu__utilization__gte=threshold) | Exists(busy_minutes))
    return set(busy.values_list("workload_id", flat=True))


def _endpoints(notebooks: list[Workload]) -> dict[int, str]:
    """Return {workload id: endpoint of replica 0 of its current attempt} for those that reported one."""
    attempts = {workload.pk: workload.attempt for workload in notebooks}
    rows = Replica.all_tenants.filter(workload_id__in=list(attempts), index=0).exclude(endpoint="")
    return {
        workload_id: endpoint
        for workload_id, attempt, endpoint in rows.values_list("workload_id", "attempt", "endpoint")
        if attempts[workload_id] == attempt
    }


def _probe(notebooks: list[Workload], endpoints: dict[int, str], source: ActivitySource) -> dict[int, JupyterActivity]:
    """Ask each notebook's Jupyter server for its activity, a few at a time; those that fail are left out."""

    def ask(workload: Workload) -> tuple[int, JupyterActivity | None]:
        try:
            return workload.pk, source.activity(
                endpoint=endpoints[workload.pk], workload_id=workload.pk, token=workload.session_secret
            )
        except JupyterUnavailable as error:
            log.info("notebook %s: Jupyter did not answer the idle check: %s", workload.pk, error)
            return workload.pk, None

    reachable = [workload for workload in notebooks if workload.pk in endpoints]
    with ThreadPoolExecutor(max_workers=PROBE_THREADS) as pool:
        answers = list(pool.map(ask, reachable))
    return {workload_id: activity for workload_id, activity in answers if activity is not None}


def _seen(*, now: datetime, gpu_busy: bool, jupyter: JupyterActivity | None) -> datetime | None:
    """Return the latest activity this check observed (now, for anything busy right now), or None."""
    if gpu_busy or (jupyter is not None and jupyter.busy_kernels):
        return now
    if jupyter is not None and jupyter.last_activity is not None:
        return min(jupyter.last_activity, now)  # a node clock ahead of ours must not push activity into the future
    return None


def check_idle_notebooks(*, now: datetime, source: ActivitySource | None = None) -> dict[str, int]:
    """Update every running notebook's activity, warn the idle ones, stop those idle too long; return counts.

    Counts: `checked`, and per notebook one of `active`, `idle`, `warned`,
    `stopped`; `unreachable` counts Jupyter servers that did not answer
    (their notebooks are judged on GPU use alone). `source` reads Jupyter's
    activity (default: `JupyterClient`). Looks across tenants: controller
    only (the periodic task `jobs.check_idle_notebooks`). Safe to run twice
    at once: every change is a compare-and-swap.
    """
    notebooks = list(
        Workload.all_tenants.filter(kind=WorkloadKind.NOTEBOOK, state=WorkloadState.RUNNING).select_related("tenant")
    )
    counts: Counter[str] = Counter(checked=len(notebooks))
    if not notebooks:
        return dict(counts)
    ids = [workload.pk for workload in notebooks]
    gpu_busy = _busy_on_gpu(ids, now=now)
    endpoints = _endpoints(notebooks)
    jupyter = _probe(notebooks, endpoints, source or JupyterClient())
    counts["unreachable"] = len(endpoints) - len(jupyter)
    for workload in notebooks:
        _record_lab_path(workload, jupyter.get(workload.pk))
        seen = _seen(now=now, gpu_busy=workload.pk in gpu_busy, jupyter=jupyter.get(workload.pk))
        counts[_check_one(workload, now=now, seen=seen)] += 1
    return dict(counts)


def _check_one(workload: Workload, *, now: datetime, seen: datetime | None) -> str:
    """Apply one check's observation to one notebook; return `active`, `warned` or `stopped`."""
    known = [t for t in (workload.started_at, workload.last_activity_at, seen) if t is not None]
    last = max(known) if known else now
    if last != workload.last_activity_at:
        _record_activity(workload, last)
    timeout = idle_timeout_seconds(workload)
    warning = min(int(settings.NOTEBOOK_IDLE_WARNING_SECONDS), timeout)
    start = max(last, workload.idle_extended_at) if workload.idle_extended_at else last
    idle = (now - start).total_seconds()
    warned_at = workload.idle_warned_at
    if idle < timeout - warning:
        if warned_at is not None:
            _clear_warning(workload, warned_at)
        return "active"
    deadline = start + timedelta(seconds=timeout)
    if warned_at is None:
        warned_at = _warn(workload, now=now, idle=idle, stop_at=max(deadline, now + timedelta(seconds=warning)))
        if warned_at is None:
            return "warned"  # another check warned first, and will stop it in time
    if now < max(deadline, warned_at + timedelta(seconds=warning)):
        return "warned"
    return "stopped" if _stop(workload, idle=idle) else "warned"


def _record_lab_path(workload: Workload, jupyter: JupyterActivity | None) -> None:
    """Remember the file its owner worked on last, where Resume brings them back after hibernation."""
    path = jupyter.last_path if jupyter is not None else None
    if path and path != workload.lab_path:
        with tenant_scope(workload.tenant):
            Workload.objects.filter(pk=workload.pk).update(lab_path=path[:500])
        workload.lab_path = path[:500]


# The writes below name one notebook: each runs under its tenant's scope (the pass loaded it with its tenant).


def _record_activity(workload: Workload, at: datetime) -> None:
    with tenant_scope(workload.tenant):
        Workload.objects.filter(pk=workload.pk, state=WorkloadState.RUNNING).update(last_activity_at=at)


def _event(workload: Workload, kind: str, message: str) -> None:
    with tenant_scope(workload.tenant):
        WorkloadEvent.objects.create(tenant_id=workload.tenant_id, workload=workload, kind=kind, message=message)


@transaction.atomic
def _clear_warning(workload: Workload, warned_at: datetime) -> bool:
    """Clear a warning that activity made moot; return whether this check cleared it."""
    with tenant_scope(workload.tenant):
        cleared = Workload.objects.filter(pk=workload.pk, idle_warned_at=warned_at).update(idle_warned_at=None)
    if cleared:
        _event(workload, "workload.idle_warning_cleared", "Activity seen: the idle stop is called off.")
    return cleared == 1


@transaction.atomic
def _warn(workload: Workload, *, now: datetime, idle: float, stop_at: datetime) -> datetime | None:
    """Warn the owner once; return the warning's time, or None when another check warned first."""
    with tenant_scope(workload.tenant):
        warned = Workload.objects.filter(
            pk=workload.pk, state=WorkloadState.RUNNING, idle_warned_at__isnull=True
        ).update(idle_warned_at=now)
    if not warned:
        return None
    remedy = "use it" if workload.idle_extended_at else "extend it or use it"
    when = f"{stop_at.astimezone(UTC):%H:%M} UTC"
    message = (
        f"Idle for {_duration(idle)}: this notebook will be hibernated at {when} unless you {remedy}. "
        "Its files stay in your home; resume it any time from its page."
    )
    _event(workload, "workload.idle_warning", message)
    notify_idle_warning(
        tenant=workload.tenant, owner_id=workload.owner_id, workload_id=workload.pk, name=workload.name,
        stop_at=stop_at, message=message,
    )  # fmt: skip
    return now


def _stop(workload: Workload, *, idle: float) -> bool:
    message = (
        f"Hibernated after {_duration(idle)} idle: no GPU use at or above "
        f"{settings.NOTEBOOK_IDLE_UTILIZATION}% and no notebook activity. Its GPU is free; Resume brings it back "
        "with its files."
    )
    return stop_workload(
        workload_id=workload.pk,
        to_state=WorkloadState.HIBERNATED,
        reason_code=ReasonCode.IDLE,
        message=message,
        from_states=(WorkloadState.RUNNING,),
    )


def _cannot_extend(workload: Workload) -> Conflict:
    """Return the Conflict that says why `workload` (reloaded) cannot be extended now."""
    if workload.kind != WorkloadKind.NOTEBOOK or workload.state != WorkloadState.RUNNING:
        return Conflict(
            f"Only running notebooks can be extended; {workload.name} is a {workload.kind} that is {workload.state}.",
            code="not_extendable",
            details={"current_state": workload.state, "kind": workload.kind},
        )
    if workload.idle_extended_at is not None:
        return Conflict(
            f"{workload.name} was already extended once; use it to keep it running.",
            code="already_extended",
            details={"idle_extended_at": workload.idle_extended_at.isoformat()},
        )
    return Conflict(
        f"{workload.name} has not been warned as idle; there is nothing to extend yet.",
        code="not_idle_warned",
        details={"current_state": workload.state},
    )


def extendable(workload: Workload) -> bool:
    """Return whether `workload` may be extended now: a running notebook warned as idle and not extended yet
    this session (what `extend_notebook`'s compare-and-swap asks of the row)."""
    return (
        workload.kind == WorkloadKind.NOTEBOOK
        and workload.state == WorkloadState.RUNNING
        and workload.idle_warned_at is not None
        and workload.idle_extended_at is None
    )


@transaction.atomic
def extend_notebook(*, actor: Actor, workload: Workload) -> Workload:
    """Extend an idle-warned running notebook once (its idle clock restarts now); return it reloaded.

    Members extend their own notebooks, tenant admins any in the tenant.
    Raises PermissionDenied, Http404, or Conflict (`not_extendable`,
    `not_idle_warned`, `already_extended`: a notebook is extended at most
    once per session).
    """
    role = require_role(actor, workload.tenant, Role.MEMBER)
    if not may_act(role, owner_id=workload.owner_id, viewer_id=actor.user.pk if actor.user is not None else None):
        raise PermissionDenied("Members can extend only their own notebooks.")
    now = timezone.now()
    with tenant_scope(workload.tenant):
        extended = Workload.objects.filter(
            pk=workload.pk,
            kind=WorkloadKind.NOTEBOOK,
            state=WorkloadState.RUNNING,
            idle_warned_at__isnull=False,
            idle_extended_at__isnull=True,
        ).update(idle_extended_at=now, idle_warned_at=None, updated_at=now)
        current = Workload.objects.select_related("project", "pool", "owner", "tenant").get(pk=workload.pk)
    if not extended:
        raise _cannot_extend(current)
    timeout = idle_timeout_seconds(current)
    _event(
        current,
        "workload.idle_extended",
        f"Extended by {actor.label}: it will be stopped after {_duration(timeout)} more without activity.",
    )
    record_audit_event(
        actor=actor,
        action="workload.extend",
        obj=current,
        tenant_id=current.tenant_id,
        after={"idle_extended_at": now.isoformat()},
    )
    return current
