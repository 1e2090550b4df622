"""GPU telemetry read per workload and per project: the rollup minutes of the GPUs they held.

Rollup minutes belong to GPUs, not workloads: a workload's are read through
its allocations (the minutes from the one it took the GPU in until it gave it
back), so a minute in which a GPU changed hands counts for both holders.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import DateTimeField, ExpressionWrapper, OuterRef, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce, Least, Trunc
from django.utils import timezone

from inventory.models import GpuMinute
from inventory.selectors import MinuteRow, gpu_minutes_in, minute_start
from jobs.models import Allocation, Workload


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
