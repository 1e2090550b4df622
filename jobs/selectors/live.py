"""The live streams' reads: what the WebSocket consumers send, and who may watch it.

Their URLs name no tenant (or name it for events), so these look across
tenants and decide visibility themselves, with the API's rule: anyone with a
role in the workload's tenant may watch (viewers included), operators
everywhere, a token only in its own tenant. Whatever may not be watched
reads exactly as what does not exist.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from inventory.selectors import MinuteRow
from jobs.choices import TERMINAL_STATES
from jobs.models import Allocation, Workload
from jobs.selectors.logs import _chunk_lines
from jobs.selectors.telemetry import workload_gpu_minutes
from tenants.context import Actor
from tenants.models import Project, Tenant
from tenants.scoping import tenant_scope
from tenants.selectors import role_in_tenant

LiveRow = dict[str, Any]
"""A workload as the events stream sends it: id, project, name, kind, state, reason_code, reason,
queue_position, updated_at (RFC 3339)."""

_LIVE_ROW_FIELDS = (
    "id",
    "tenant_id",
    "project__slug",
    "name",
    "kind",
    "state",
    "reason_code",
    "reason_message",
    "queue_position",
    "updated_at",
)


def _live_row(values: dict[str, Any]) -> LiveRow:
    return {
        "id": values["id"],
        "project": values["project__slug"],
        "name": values["name"],
        "kind": values["kind"],
        "state": values["state"],
        "reason_code": values["reason_code"],
        "reason": values["reason_message"],
        "queue_position": values["queue_position"],
        "updated_at": values["updated_at"].isoformat(),
    }


def live_row_of(workload: Workload) -> LiveRow:
    """Return the live row of a workload in hand (its project loaded), as `live_workload_rows` reads it."""
    values = {name: getattr(workload, name) for name in _LIVE_ROW_FIELDS if name != "project__slug"}
    return _live_row({**values, "project__slug": workload.project.slug})


def live_workload_rows(workload_ids: list[int]) -> list[tuple[int, LiveRow]]:
    """Return (tenant id, row) for each of these workloads that exists, by id; one query.

    Looks across tenants: the publishers read the rows of what a commit
    changed, to send each tenant's to its own event group.
    """
    rows = Workload.all_tenants.filter(pk__in=workload_ids).order_by("pk").values(*_LIVE_ROW_FIELDS)
    return [(values["tenant_id"], _live_row(values)) for values in rows]


def live_rows_of_tenant(tenant: Tenant, *, project_id: int | None = None) -> list[LiveRow]:
    """Return the rows of a tenant's workloads that have not ended (of one project when given), oldest first.

    Reads in `tenant`'s scope (a consumer has no request scope): the events
    stream calls it after `live_events_scope` allowed that tenant.
    """
    with tenant_scope(tenant):
        workloads = Workload.objects.exclude(state__in=TERMINAL_STATES)
        if project_id is not None:
            workloads = workloads.filter(project_id=project_id)
        return [_live_row(values) for values in workloads.order_by("submitted_at", "pk").values(*_LIVE_ROW_FIELDS)]


def live_events_scope(actor: Actor, tenant_slug: str, project_slug: str | None) -> tuple[Tenant, Project | None] | None:
    """Return the tenant (and project) whose workload events `actor` may watch, or None.

    None when the tenant does not exist or the actor has no role there, and
    when `project_slug` names no project of that tenant: the same answer.
    """
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None or role_in_tenant(actor, tenant) is None:
        return None
    if project_slug is None:
        return tenant, None
    with tenant_scope(tenant):
        project = Project.objects.filter(slug=project_slug).first()
    return (tenant, project) if project is not None else None


def watchable_workload(actor: Actor, workload_id: int) -> Workload | None:
    """Return workload `workload_id` with its tenant loaded if `actor` may watch it live, else None.

    Looks across tenants; a workload of a tenant the actor has no role in
    (or a token of another tenant) answers None, as a missing one does.
    """
    workload = Workload.all_tenants.select_related("tenant").filter(pk=workload_id).first()
    if workload is None or role_in_tenant(actor, workload.tenant) is None:
        return None
    return workload


def live_workload_state(workload: Workload) -> str | None:
    """Return the workload's state now, or None when it no longer exists.

    `workload` must come from `watchable_workload`; the read runs in its tenant's scope.
    """
    with tenant_scope(workload.tenant):
        return Workload.objects.filter(pk=workload.pk).values_list("state", flat=True).first()


def live_log_lines(workload: Workload, *, since: int, limit: int) -> list[list[Any]]:
    """Return up to `limit` stored lines numbered above `since`, in the stored list form, in order.

    `workload` must come from `watchable_workload`; the read runs in its
    tenant's scope.
    """
    start = since + 1
    with tenant_scope(workload.tenant):
        return [line for line in _chunk_lines(workload, start, limit) if line[0] >= start][:limit]


def live_log_tail(workload: Workload, *, tail: int) -> tuple[int, list[list[Any]]]:
    """Return the number of the last stored line and the last `tail` lines (in the stored list form).

    Counts the lines now rather than trusting `workload` (read earlier):
    the caller continues from the returned number.
    """
    with tenant_scope(workload.tenant):
        log_seq = Workload.objects.filter(pk=workload.pk).values_list("log_seq", flat=True).first() or 0
    lines = live_log_lines(workload, since=max(log_seq - tail, 0), limit=tail) if tail > 0 else []
    return log_seq, lines


def live_workload_gpus(workload: Workload) -> list[dict[str, Any]]:
    """Return the GPUs the workload holds now as {uuid, index, node, model}, by node and index.

    `workload` must come from `watchable_workload`; the read runs in its tenant's scope.
    """
    with tenant_scope(workload.tenant):
        allocations = Allocation.objects.filter(workload_id=workload.pk, released_at__isnull=True, gpu__isnull=False)
        rows = list(
            allocations.order_by("node__name", "gpu__index").values_list(
                "gpu__uuid", "gpu__index", "node__name", "gpu__model"
            )
        )
    return [{"uuid": uuid, "index": index, "node": node, "model": model} for uuid, index, node, model in rows]


def live_workload_history(workload: Workload, *, since: datetime) -> dict[str, list[MinuteRow]]:
    """Return the per-minute rollups of the GPUs the workload held since `since` (`workload_gpu_minutes`).

    `workload` must come from `watchable_workload`; the read runs in its tenant's scope.
    """
    with tenant_scope(workload.tenant):
        return workload_gpu_minutes(workload, since=since)
