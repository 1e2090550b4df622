"""Reading the hourly rollups (`accounting.models.UsageHour`): which hours are settled, and their usage by group."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Case, IntegerField, QuerySet, Sum, Value, When

from accounting.choices import Dimension
from accounting.models import RollupMark, UsageHour
from accounting.selectors.figures import Group, Usage, Window
from inventory.models import NodePool
from tenants.models import Project, Tenant

# The report dimensions, seen from an hourly rollup (which keeps no workload): the id column, and where its names
# are (none: the column is the name). Every tenant's projects: the rollups' rows are scoped already.
_ROLLED: dict[str, tuple[str, Callable[[], QuerySet[Any]] | None, str]] = {
    Dimension.TENANT: ("tenant_id", Tenant.objects.all, "slug"),
    Dimension.PROJECT: ("project_id", Project.all_tenants.all, "slug"),
    Dimension.USER: ("owner_id", User.objects.all, "username"),
    Dimension.POOL: ("pool_id", NodePool.objects.all, "name"),
    Dimension.GPU_MODEL: ("gpu_model", None, ""),
}
_HOUR = timedelta(hours=1)
_RANGES_APART = 4  # rollup ranges read a query each; more are read together (rolled_up)


def settled_hours() -> Window | None:
    """Return the hours the rollups may be read for ([from, until), see RollupMark), or None before any."""
    mark = RollupMark.objects.filter(pk=1).first()
    if mark is None or mark.rolled_from is None or mark.settled_until is None:
        return None
    return mark.rolled_from, mark.settled_until


def rolled_hours(start: datetime, end: datetime, dims: tuple[str, ...], settled: Window | None) -> Window:
    """Return the whole settled hours inside [start, end) as [first, last): empty (first >= last) when none."""
    if settled is None or Dimension.WORKLOAD in dims:
        return start, start
    first, last = _floor_hour(start), _floor_hour(end)
    if first < start:
        first += _HOUR
    return max(first, settled[0]), min(last, settled[1])


def _floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def rolled_up(scope: dict[str, Any], ranges: Sequence[Window], dims: tuple[str, ...]) -> list[dict[Group, Usage]]:
    """Return the rollups' usage by group in each of the hour ranges `ranges` (disjoint, earliest first),
    grouped by ids (no join over a year of rows), then one query per dimension for the names of those found.

    A few ranges are read a query each. More (a report's buckets) are read in
    one query that tells them apart with a CASE: the planner expects as many
    groups of it as rows, so it would sort a year's rows on disk where a hash
    of a few thousand groups does.
    """
    columns = [_ROLLED[dim][0] for dim in dims]
    rows = UsageHour.all_tenants.filter(hour__gte=ranges[0][0], hour__lt=ranges[-1][1], **scope)  # caller's scope
    found_rows: list[tuple[Any, ...]] = []
    if len(ranges) <= _RANGES_APART:
        for index, (first, last) in enumerate(ranges):
            apart = rows.filter(hour__gte=first, hour__lt=last).values_list("pool_id", "gpu_model", *columns)
            found_rows += [(index, *row) for row in _summed(apart)]
    else:
        which = Case(
            *(When(hour__gte=first, hour__lt=last, then=Value(index)) for index, (first, last) in enumerate(ranges)),
            output_field=IntegerField(),
        )
        together = rows.annotate(part=which).filter(part__isnull=False)
        found_rows = list(_summed(together.values_list("part", "pool_id", "gpu_model", *columns)))
    names = [_names(dim, {row[3 + index] for row in found_rows}) for index, dim in enumerate(dims)]
    found: list[dict[Group, Usage]] = [defaultdict(Usage) for _ in ranges]
    for part, pool_id, model, *values in found_rows:
        key = tuple(named.get(value, "") for named, value in zip(names, values[: len(dims)], strict=True))
        found[part][(key, pool_id, model)].add(Usage(*values[len(dims) :]))
    return found


def _summed(rows: QuerySet[UsageHour, tuple[Any, ...]]) -> QuerySet[UsageHour, tuple[Any, ...]]:
    """`rows` (a values_list) with the six figures summed per group."""
    return rows.annotate(
        gpu=Sum("gpu_seconds"),
        cpu=Sum("cpu_seconds"),
        memory=Sum("memory_gib_seconds"),
        sampled=Sum("sampled_gpu_seconds"),
        utilization=Sum("utilization_minutes"),
        idle=Sum("idle_gpu_seconds"),
    ).order_by()


def _names(dim: str, ids: set[Any]) -> dict[Any, str]:
    """Return the name of each of `ids` of dimension `dim` (its slug, username or name) as a report shows it."""
    _, rows, name = _ROLLED[dim]
    if rows is None:
        return {value: value for value in ids}
    return dict(rows().filter(pk__in=sorted(ids)).values_list("pk", name))
