"""Reading the ledger (the allocations) for reports: what each allocation held inside given windows, by group,
with the GPU minutes it held beside it. The rule every figure follows, rolled up or not."""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from functools import reduce
from typing import Any

from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import (
    BooleanField,
    Case,
    Count,
    DateTimeField,
    F,
    FloatField,
    Func,
    IntegerField,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest, Least
from django.db.models.sql.compiler import SQLCompiler

from accounting.choices import Dimension
from accounting.selectors.figures import Group, Usage, Window
from accounting.sql import SecondsBetween
from inventory.models import GpuMinute
from jobs.models import Allocation

# Where each dimension is, seen from an allocation.
_PATHS: dict[str, str] = {
    Dimension.TENANT: "workload__tenant__slug",
    Dimension.PROJECT: "workload__project__slug",
    Dimension.USER: "workload__owner__username",
    Dimension.POOL: "workload__pool__name",
    Dimension.GPU_MODEL: "gpu__model",
    Dimension.WORKLOAD: "workload__name",
    # Not report dimensions: the ids the hourly rollups keep (ROLLUP_DIMS).
    "tenant_id": "tenant_id",
    "project_id": "workload__project_id",
    "owner_id": "workload__owner_id",
}
ROLLUP_DIMS = ("tenant_id", "project_id", "owner_id")
_WORKLOAD_ID = "workload_id"
# What every query also groups by, to price its rows.
_POOL_ID, _MODEL = "workload__pool_id", "gpu__model"
_HALF_MINUTE = timedelta(seconds=30)
IDS_PER_QUERY = 20_000  # allocations read by id per pair of queries: well under SQLite's 32,766 parameters
WINDOWS_PER_QUERY = 48  # four columns each: far from Postgres' 1,664 in a query, and a query quick to build


def _key(row: dict[str, Any], dims: Iterable[str]) -> tuple[str, ...]:
    values = []
    for dim in dims:
        value = row[_PATHS[dim]]
        if dim == Dimension.WORKLOAD:
            value = f"{value} #{row[_WORKLOAD_ID]}"
        values.append("" if value is None else str(value))
    return tuple(values)


def _group_paths(dims: Iterable[str], prefix: str = "") -> list[str]:
    paths = {_POOL_ID, _MODEL}
    for dim in dims:
        paths.add(_PATHS[dim])
        if dim == Dimension.WORKLOAD:
            paths.add(_WORKLOAD_ID)
    # Seen from a GPU's minutes, the allocation is behind gpu__allocations; the GPU's own model is not.
    return sorted(path if path.startswith("gpu__") else f"{prefix}{path}" for path in paths)


def overlapping(start: datetime, end: datetime) -> Q:
    """Allocations held at some moment of [start, end)."""
    return Q(created_at__lt=end) & (Q(released_at__isnull=True) | Q(released_at__gt=start))


def overlaps(created: datetime, released: datetime | None, start: datetime, end: datetime) -> bool:
    """Whether an allocation held from `created` to `released` (None: still held) is one `overlapping` finds."""
    return created < end and (released is None or released > start)


def _joined(windows: Sequence[Window]) -> list[Window]:
    """Return `windows` (disjoint, earliest first) with each run of adjacent ones joined into one."""
    joined = [windows[0]]
    for start, end in windows[1:]:
        if start == joined[-1][1]:
            joined[-1] = (joined[-1][0], end)
        else:
            joined.append((start, end))
    return joined


def chunks(ids: list[int]) -> Iterator[list[int]]:
    for first in range(0, len(ids), IDS_PER_QUERY):
        yield ids[first : first + IDS_PER_QUERY]


def held(
    allocations: QuerySet[Allocation],
    scope: dict[str, Any],
    windows: Sequence[Window],
    dims: tuple[str, ...],
) -> list[dict[Group, Usage]]:
    """Return, for each of `windows` (disjoint, earliest first), the usage per group held in it.

    An allocation counts the seconds of it inside the window: one still
    open counts until the window's end. For each WINDOWS_PER_QUERY
    windows, the allocations overlapping them are listed first (one query of
    the ledger alone), then read by id, a pair of queries per IDS_PER_QUERY
    of them: told how few rows it joins, the planner looks their workloads
    and GPU minutes up by index instead of reading those tables whole.
    """
    found: list[dict[Group, Usage]] = []
    for first in range(0, len(windows), WINDOWS_PER_QUERY):
        some = windows[first : first + WINDOWS_PER_QUERY]
        found_here = allocations.filter(overlapping(some[0][0], some[-1][1])).order_by()
        parts: list[dict[Group, Usage]] = [defaultdict(Usage) for _ in some]
        for chunk in chunks(sorted(found_here.values_list("pk", flat=True))):
            held_by(chunk, scope, some, dims, parts)
        found += parts
    return found


def held_by(
    ids: list[int],
    scope: dict[str, Any],
    windows: Sequence[Window],
    dims: tuple[str, ...],
    found: list[dict[Group, Usage]],
) -> None:
    """Add what the allocations `ids` held in each of `windows` to `found`'s groups: two queries."""
    per_gpu = Greatest(F("workload__gpus_per_replica"), Value(1))
    measures: dict[str, Any] = {}
    for index, (start, end) in enumerate(windows):
        low = Value(start, output_field=DateTimeField())
        high = Value(end, output_field=DateTimeField())
        held = SecondsBetween(Least(Coalesce(F("released_at"), high), high), Greatest(F("created_at"), low))
        inside = overlapping(start, end)
        measures[f"n{index}"] = Count("id", filter=inside)
        measures[f"gpu{index}"] = _sum(held, inside & Q(gpu__isnull=False))
        measures[f"cpu{index}"] = _sum(held * F("workload__cpu_milli") / (Value(1000.0) * per_gpu), inside)
        measures[f"memory{index}"] = _sum(held * F("workload__memory_mib") / (Value(1024.0) * per_gpu), inside)
    rows = Allocation.all_tenants.filter(_IsIn(F("pk"), ids)).values(*_group_paths(dims)).annotate(**measures)
    for row in rows:
        group = (_key(row, dims), row[_POOL_ID], row[_MODEL] or "")
        for index, part in enumerate(found):
            if row[f"n{index}"]:
                part[group].add(Usage(row[f"gpu{index}"], row[f"cpu{index}"], row[f"memory{index}"]))
    for index, group, sampled, utilization, idle in _minutes(scope, ids, windows, dims):
        found[index][group].add(
            Usage(sampled_gpu_seconds=sampled, utilization_minutes=utilization, idle_gpu_seconds=idle)
        )


def _sum(value: Any, condition: Q) -> Coalesce:
    return Coalesce(Sum(value, filter=condition, output_field=FloatField()), 0.0, output_field=FloatField())


def _minutes(
    scope: dict[str, Any], ids: list[int], windows: Sequence[Window], dims: tuple[str, ...]
) -> Iterable[tuple[int, Group, float, float, float]]:
    """Yield (window index, group, sampled seconds, utilization-minutes, idle seconds) of the GPU minutes the
    allocations `ids` held.

    A minute counts in the window that holds its middle, when its middle lies
    inside an allocation of its GPU; every condition on the allocation sits
    in one filter() so they all speak of the same allocation.
    """
    middle = F("minute") + _HALF_MINUTE
    prefix = "gpu__allocations__"
    threshold = float(settings.NOTEBOOK_IDLE_UTILIZATION)
    ranges = [Q(minute__gte=start - _HALF_MINUTE, minute__lt=end - _HALF_MINUTE) for start, end in windows]
    # The windows' minutes as few ranges as they make (adjacent windows joined): a condition per window would
    # read as far fewer rows to the planner than there are, and have it pick a nested loop over them.
    spans = [Q(minute__gte=start - _HALF_MINUTE, minute__lt=end - _HALF_MINUTE) for start, end in _joined(windows)]
    held = (
        Q(**{f"{prefix}{name}": value for name, value in scope.items()})
        & Q(_IsIn(F(f"{prefix}id"), ids))
        & reduce(operator.or_, spans)
        & Q(gpu__allocations__created_at__lte=middle)
    )
    held &= Q(gpu__allocations__released_at__isnull=True) | Q(gpu__allocations__released_at__gt=middle)
    window = Case(
        *(When(inside, then=Value(index)) for index, inside in enumerate(ranges)), output_field=IntegerField()
    )
    rows = (
        GpuMinute.objects.filter(held)
        .annotate(window=window)
        .values("window", *_group_paths(dims, prefix))
        .annotate(
            sampled=Count("id"),
            utilization=Sum(F("utilization_sum") / F("samples"), output_field=FloatField()),
            idle=Count("id", filter=Q(utilization_sum__lt=F("samples") * threshold)),
        )
    )
    for row in rows:
        plain = {path.removeprefix(prefix): value for path, value in row.items()}
        group = (_key(plain, dims), plain[_POOL_ID], plain[_MODEL] or "")
        yield row["window"], group, row["sampled"] * 60.0, row["utilization"] or 0.0, row["idle"] * 60.0


class _IsIn(Func):
    """`expression IN values`; on Postgres `= ANY(values)`, one array parameter: a placeholder per value cost
    more to send and parse than the query's own work, with thousands of allocation ids."""

    output_field = BooleanField()

    def __init__(self, expression: Any, values: list[int]) -> None:
        super().__init__(expression)
        self.values = values

    def as_sql(
        self,
        compiler: SQLCompiler,
        connection: BaseDatabaseWrapper,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> Any:
        sql, params = compiler.compile(self.source_expressions[0])
        if not self.values:
            return "1 = 0", []
        return f"{sql} IN ({', '.join(['%s'] * len(self.values))})", [*params, *self.values]

    def as_postgresql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any) -> Any:
        sql, params = compiler.compile(self.source_expressions[0])
        return f"{sql} = ANY(%s)", [*params, self.values]
