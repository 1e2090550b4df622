"""Scoped reads of the jobs app.

Functions run under the active tenant scope (the default managers enforce
it) unless their docstring says they look across tenants, which only the
controller's hooks do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser, User
from django.db import connection
from django.db.models import (
    Count,
    DateTimeField,
    ExpressionWrapper,
    F,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, Least, Trunc
from django.utils import timezone

from inventory.models import GpuMinute
from inventory.selectors import MinuteRow, gpu_minutes_in, minute_start
from jobs.choices import TERMINAL_STATES, WorkloadKind, WorkloadState
from jobs.models import Allocation, AllowedImage, LaunchPreset, LogChunk, Replica, Workload, WorkloadEvent
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Membership, Project, Tenant
from tenants.scoping import tenant_scope
from tenants.selectors import role_in_tenant


def workloads_for_tenant(
    *,
    state: str | None = None,
    project: Project | None = None,
    owner: User | None = None,
    kind: str | None = None,
) -> QuerySet[Workload]:
    """Return the active tenant's workloads, newest first, with project, pool and owner loaded; filters are optional."""
    workloads = Workload.objects.select_related("project", "pool", "owner")
    if state is not None:
        workloads = workloads.filter(state=state)
    if project is not None:
        workloads = workloads.filter(project=project)
    if owner is not None:
        workloads = workloads.filter(owner=owner)
    if kind is not None:
        workloads = workloads.filter(kind=kind)
    return workloads


def workloads_with_details() -> QuerySet[Workload]:
    """Return the active tenant's workloads with their allocations (node and GPU) and events prefetched."""
    allocations = Allocation.objects.select_related("node", "gpu").order_by("replica", "id")
    return workloads_for_tenant().prefetch_related(
        Prefetch("allocations", queryset=allocations),
        Prefetch("events", queryset=WorkloadEvent.objects.order_by("created_at", "id")),
    )


def workload_detail(workload_id: int) -> Workload | None:
    """Return one of the active tenant's workloads with allocations and events loaded, or None."""
    return workloads_with_details().filter(pk=workload_id).first()


def active_allocations_by_node(node_ids: list[int]) -> dict[int, int]:
    """Return {node id: active allocations on it} for `node_ids`; looks across tenants (the drain rule needs all)."""
    rows = (
        Allocation.all_tenants.filter(node_id__in=node_ids, released_at__isnull=True)
        .values("node_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {row["node_id"]: row["n"] for row in rows}


# --- logs -----------------------------------------------------------------------------


class LogLine(TypedDict):
    """One stored output line of a workload; `seq` numbers lines per workload from 1."""

    seq: int
    timestamp: str
    stream: str
    text: str
    attempt: int
    replica: int


@dataclass(frozen=True)
class LogPage:
    """Lines of a workload's log, where to continue (`next_since`), and whether no more will come."""

    lines: list[LogLine]
    next_since: int
    complete: bool


def _log_line(stored: list[Any]) -> LogLine:
    seq, timestamp, stream, text, attempt, replica = stored
    return {"seq": seq, "timestamp": timestamp, "stream": stream, "text": text, "attempt": attempt, "replica": replica}


def _chunk_lines(workload: Workload, start: int, limit: int) -> list[list[Any]]:
    """Return the stored lines of the chunks that may hold seq `start` .. `start + limit - 1`, in order."""
    chunks = LogChunk.objects.filter(workload_id=workload.pk)
    # The chunk holding `start` begins at or before it: one backward index probe finds it, so the
    # range read below stays bounded however long the log is.
    holder = chunks.filter(first_seq__lte=start).order_by("-first_seq").values("first_seq")[:1]
    wanted = chunks.filter(first_seq__gte=Coalesce(Subquery(holder), Value(0)), first_seq__lt=start + limit)
    rows = list(wanted.order_by("first_seq").values_list("lines", flat=True))
    if not rows:
        # Retention removed everything from `start` on for `limit` lines: go on from the oldest line kept.
        oldest = chunks.filter(first_seq__gt=start).order_by("first_seq").values_list("first_seq", flat=True).first()
        if oldest is not None:
            wanted = chunks.filter(first_seq__gte=oldest, first_seq__lt=oldest + limit)
            rows = list(wanted.order_by("first_seq").values_list("lines", flat=True))
    return [line for lines in rows for line in lines]


def log_lines_after(workload: Workload, *, since: int, limit: int) -> list[LogLine]:
    """Return up to `limit` of the workload's log lines numbered above `since`, in order.

    `workload` must come from the active tenant's scope; the lines are read
    through it too. Lines removed by retention are skipped.
    """
    start = since + 1
    return [_log_line(line) for line in _chunk_lines(workload, start, limit) if line[0] >= start][:limit]


def workload_log(workload: Workload, *, since: int | None, limit: int) -> LogPage:
    """Return a page of the workload's log: the lines after `since`, or the last `limit` lines when it is None.

    `next_since` is the last line's number (the `since` to poll with next;
    when no line came back, where this page started). `complete` says the
    workload has ended and no line after `next_since` is stored, so polling
    can stop.
    """
    after = max(workload.log_seq - limit, 0) if since is None else since
    lines = log_lines_after(workload, since=after, limit=limit)
    next_since = lines[-1]["seq"] if lines else after
    complete = workload.state in TERMINAL_STATES and next_since >= workload.log_seq
    return LogPage(lines=lines, next_since=next_since, complete=complete)


def iter_log_lines(workload: Workload, *, chunks_per_read: int = 200) -> Iterator[LogLine]:
    """Yield every stored line of `workload` in order, reading `chunks_per_read` chunks at a time.

    For downloads: a streamed response is consumed after the view returned
    and its tenant scope ended, so each read enters the workload's own
    tenant scope for the length of that read only (never across a yield).
    `workload` must have been fetched through the active scope.
    """
    tenant = workload.tenant
    after = 0
    while True:
        with tenant_scope(tenant):
            rows = list(
                LogChunk.objects.filter(workload_id=workload.pk, first_seq__gt=after)
                .order_by("first_seq")
                .values_list("first_seq", "lines")[:chunks_per_read]
            )
        for _, lines in rows:
            yield from (_log_line(line) for line in lines)
        if len(rows) < chunks_per_read:
            return
        after = rows[-1][0]


def presets_for_tenant() -> QuerySet[LaunchPreset]:
    """Return the active tenant's launch presets by name, with their pools loaded."""
    return LaunchPreset.objects.select_related("pool").order_by("name")


def allowed_images_for_tenant(tenant_id: int) -> QuerySet[AllowedImage]:
    """Return the image patterns that apply to one tenant: its own and the platform-wide ones, never another's.

    Allowed images are not tenant-owned rows (platform-wide ones have no
    tenant), so this names the tenant instead of relying on the scope.
    """
    return AllowedImage.objects.filter(Q(tenant_id=tenant_id) | Q(tenant__isnull=True)).select_related("tenant")


def allowed_images_for_operators() -> QuerySet[AllowedImage]:
    """Return every image pattern of the platform, platform-wide ones first, then by tenant and pattern."""
    return AllowedImage.objects.select_related("tenant").order_by(F("tenant__slug").asc(nulls_first=True), "pattern")


# --- notebook proxy ---------------------------------------------------------------------


@dataclass(frozen=True)
class ProxyTarget:
    """Where the notebook proxy sends a user's request: the base URL of the notebook's Jupyter server and its token."""

    workload_id: int
    endpoint: str
    secret: str = field(repr=False)
    user_id: int  # who reaches it: the proxy's WebSocket leg re-checks when this user's access changes


def _proxy_target_sql() -> str:
    """Return the proxy's access query: the notebook's endpoint and secret when the user may reach it.

    Written out rather than built by the ORM: the proxy asks on every
    request (every file of JupyterLab, every chunk of a download), and
    compiling the equivalent queryset (subqueries, Exists) cost about as
    much CPU as a 10 MB transfer through the proxy. Only the models' own
    table names, quoted by the backend, are interpolated.
    """
    quote = connection.ops.quote_name
    workload, replica, membership, tenant = (quote(m._meta.db_table) for m in (Workload, Replica, Membership, Tenant))
    return f"""
        SELECT w.session_secret,
               (SELECT r.endpoint FROM {replica} r
                 WHERE r.workload_id = w.id AND r.attempt = w.attempt AND r.{quote("index")} = 0 AND r.endpoint <> ''
                 LIMIT 1)
          FROM {workload} w
          JOIN {tenant} t ON t.id = w.tenant_id
         WHERE w.id = %(workload)s AND w.kind = %(notebook)s AND w.state IN (%(starting)s, %(running)s)
           AND w.session_secret <> '' AND t.is_active = %(active)s
           AND ((w.owner_id = %(user)s AND EXISTS (
                    SELECT 1 FROM {membership} m
                     WHERE m.tenant_id = w.tenant_id AND m.user_id = %(user)s AND m.role IN (%(member)s, %(admin)s)))
                OR EXISTS (
                    SELECT 1 FROM {membership} m
                     WHERE m.tenant_id = w.tenant_id AND m.user_id = %(user)s AND m.role = %(admin)s))
    """  # noqa: S608 -- only the models' own quoted table names are interpolated


def notebook_proxy_target(user: AbstractBaseUser | AnonymousUser, workload_id: int) -> ProxyTarget | None:
    """Return where `user` reaches notebook `workload_id` through the proxy, or None when they may not.

    Looks across tenants (the proxy's URL names no tenant). Only the
    notebook's owner (while still a member or admin of its tenant) and the
    admins of its tenant get a target, and only while the tenant is active;
    anyone else (anonymous, deactivated, another tenant, other members,
    operators who are not the tenant's admins) gets None, exactly as for a
    notebook that does not exist, is not starting or running, has no
    session secret, or whose current attempt's first replica has reported
    no endpoint yet. One query.
    """
    if not user.is_authenticated or not user.is_active:
        return None
    params = {
        "workload": workload_id,
        "active": True,
        "user": user.pk,
        "notebook": str(WorkloadKind.NOTEBOOK),
        "starting": str(WorkloadState.STARTING),
        "running": str(WorkloadState.RUNNING),
        "member": str(Role.MEMBER),
        "admin": str(Role.ADMIN),
    }
    with connection.cursor() as cursor:
        cursor.execute(_proxy_target_sql(), params)
        row = cursor.fetchone()
    if row is None or not row[1]:
        return None
    return ProxyTarget(workload_id=workload_id, endpoint=row[1], secret=row[0], user_id=user.pk)


# --- live streams -----------------------------------------------------------------------
# The WebSocket consumers' reads. Their URLs name no tenant (or name it for events), so these
# look across tenants and decide visibility themselves, with the API's rule: anyone with a role
# in the workload's tenant may watch (viewers included), operators everywhere, a token only in
# its own tenant. Whatever may not be watched reads exactly as what does not exist.

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


def live_rows_of_tenant(tenant_id: int, *, project_id: int | None = None) -> list[LiveRow]:
    """Return the rows of a tenant's workloads that have not ended (of one project when given), oldest first.

    Names its tenant instead of relying on the scope: the events stream
    calls it after `live_events_scope` allowed that tenant.
    """
    workloads = Workload.all_tenants.filter(tenant_id=tenant_id).exclude(state__in=TERMINAL_STATES)
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
    project = Project.all_tenants.filter(tenant=tenant, slug=project_slug).first()
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


def live_workload_state(workload_id: int) -> str | None:
    """Return the workload's state now, or None when it no longer exists. Looks across tenants."""
    return Workload.all_tenants.filter(pk=workload_id).values_list("state", flat=True).first()


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
    log_seq = Workload.all_tenants.filter(pk=workload.pk).values_list("log_seq", flat=True).first() or 0
    lines = live_log_lines(workload, since=max(log_seq - tail, 0), limit=tail) if tail > 0 else []
    return log_seq, lines


def live_workload_gpus(workload_id: int) -> list[dict[str, Any]]:
    """Return the GPUs the workload holds now as {uuid, index, node, model}, by node and index. Looks across tenants."""
    allocations = Allocation.all_tenants.filter(workload_id=workload_id, released_at__isnull=True, gpu__isnull=False)
    rows = allocations.order_by("node__name", "gpu__index").values_list(
        "gpu__uuid", "gpu__index", "node__name", "gpu__model"
    )
    return [{"uuid": uuid, "index": index, "node": node, "model": model} for uuid, index, node, model in rows]


def live_workload_history(workload: Workload, *, since: datetime) -> dict[str, list[MinuteRow]]:
    """Return the per-minute rollups of the GPUs the workload held since `since` (`workload_gpu_minutes`).

    `workload` must come from `watchable_workload`; the read runs in its tenant's scope.
    """
    with tenant_scope(workload.tenant):
        return workload_gpu_minutes(workload, since=since)


# --- GPU telemetry ---------------------------------------------------------------------
# Rollup minutes belong to GPUs, not workloads: a workload's are read through its allocations
# (the minutes from the one it took the GPU in until it gave it back), so a minute in which a
# GPU changed hands counts for both holders.


def workload_gpu_minutes(workload: Workload, *, since: datetime) -> dict[str, list[MinuteRow]]:
    """Return {GPU UUID: the workload's rollup minutes since `since`, oldest first} over every GPU it held.

    `workload` must come from the active tenant's scope; its allocations are
    read through it. Two queries.
    """
    allocations = Allocation.objects.filter(workload_id=workload.pk, gpu__isnull=False).exclude(released_at__lte=since)
    windows = list(allocations.values_list("gpu_id", "gpu__uuid", "created_at", "released_at"))
    minutes = gpu_minutes_in((gpu_id, max(created, since), released) for gpu_id, _, created, released in windows)
    uuids = {gpu_id: uuid for gpu_id, uuid, _, _ in windows}
    return {uuids[gpu_id]: rows for gpu_id, rows in minutes.items()}


@dataclass(frozen=True)
class GpuUsage:
    """GPU use of one project over a period: GPU-minutes allocated, and its GPUs' average utilization meanwhile.

    `utilization_avg` weighs every sample alike; None when no sample of its GPUs was rolled up.
    """

    tenant: str
    project: str
    gpu_minutes: float
    utilization_avg: float | None


def minutes_while_held() -> QuerySet[GpuMinute]:
    """Return, for a subquery of an Allocation query, its GPU's rollup minutes from the minute it was taken on."""
    taken = ExpressionWrapper(OuterRef("created_at"), output_field=DateTimeField())
    return GpuMinute.objects.filter(gpu_id=OuterRef("gpu_id"), minute__gte=Trunc(taken, "minute")).order_by()


def _rolled_up_while_held(start: datetime, end: datetime) -> tuple[Subquery, Subquery]:
    """Return subqueries of an allocation's rollup sums (utilization, samples) over its minutes in [start, end)."""
    released = ExpressionWrapper(OuterRef("released_at"), output_field=DateTimeField())
    held = minutes_while_held().filter(
        minute__gte=minute_start(start), minute__lt=Least(Coalesce(released, Value(end)), Value(end))
    )
    total = held.values("gpu_id")  # grouped by the one GPU, so each sum is a single row
    return (
        Subquery(total.annotate(s=Sum("utilization_sum")).values("s")),
        Subquery(total.annotate(n=Sum("samples")).values("n")),
    )


def gpu_usage_by_tenant(*, start: datetime, end: datetime) -> list[GpuUsage]:
    """Return each project's GPU use in [start, end), by tenant and project slug, for usage accounting.

    GPU-minutes count the time allocations held GPUs within the period (an
    allocation still held counts until `end` or now, whichever is earlier);
    utilization averages the rollup minutes of those GPUs while held.
    Looks across tenants: controller and operators only. One query.
    """
    until = min(end, timezone.now())
    utilization_sum, samples = _rolled_up_while_held(start, end)
    allocations = (
        Allocation.all_tenants.filter(gpu__isnull=False, created_at__lt=end)
        .exclude(released_at__lte=start)
        .annotate(utilization_sum=utilization_sum, samples=samples)
        .values_list(
            "tenant__slug", "workload__project__slug", "created_at", "released_at", "utilization_sum", "samples"
        )
    )
    totals: dict[tuple[str, str], list[float]] = {}
    for tenant, project, created, released, utilization_sum, samples in allocations:
        held = (min(released or until, until) - max(created, start)).total_seconds()
        total = totals.setdefault((tenant, project), [0.0, 0.0, 0])
        total[0] += max(held, 0.0) / 60
        total[1] += utilization_sum or 0.0
        total[2] += samples or 0
    return [
        GpuUsage(tenant, project, round(minutes, 3), round(util / samples, 2) if samples else None)
        for (tenant, project), (minutes, util, samples) in sorted(totals.items())
    ]
