"""Usage reports: GPU-, CPU- and memory-hours from the allocations' exact times, utilization beside them, and cost.

The allocations are the ledger: each holds one GPU (or, for a CPU-only
replica, one node) from `created_at` to `released_at`. A report sums, for
every allocation overlapping its period, the seconds it held inside the
period, so work that crossed a boundary is split exactly and every attempt
(preempted, failed or lost ones too) counts. A replica's CPU and memory are
shared out over its GPU allocations, so they count once per replica.

Utilization comes from the per-minute GPU rollups: a minute counts for an
allocation when the middle of the minute falls inside it. `idle` GPU-hours
are held minutes whose average utilization was below
NOTEBOOK_IDLE_UTILIZATION; minutes without a reading count as neither
(`sampled_gpu_seconds` says how much had one).

Cost prices each sub-window of the period with the prices in effect in it
(`accounting.models.Price`), so a price change applies from its date on.

Reads stay fast over long periods through the hourly rollups
(`accounting.models.UsageHour`, written by `accounting.rollups` with
`usage_by_hour`, this module's own rule): the whole settled hours of each
piece of constant prices are read from them, and only the ragged edges, the
recent hours and groupings by workload (which the rollups do not keep) from
the ledger; one rollup query and one pass over the ledger serve a whole
report, every bucket of it. Both are summed before pricing, so the figures
are the same whichever path served them, but for the order in which
floating-point seconds were added (see tests/accounting/test_rollups.py).
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import reduce
from itertools import pairwise
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
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

from accounting.choices import Dimension, Resource
from accounting.models import Price, RollupMark, UsageHour
from accounting.periods import Period, bucket_edges
from accounting.sql import SecondsBetween
from inventory.models import GpuMinute, NodePool
from jobs.models import Allocation
from tenants.models import Project, Tenant

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
# The same dimensions, seen from an hourly rollup (which keeps no workload): the id column, and where its names
# are (none: the column is the name). Every tenant's projects: the rollups' rows are scoped already.
_ROLLED: dict[str, tuple[str, Callable[[], QuerySet[Any]] | None, str]] = {
    Dimension.TENANT: ("tenant_id", Tenant.objects.all, "slug"),
    Dimension.PROJECT: ("project_id", Project.all_tenants.all, "slug"),
    Dimension.USER: ("owner_id", User.objects.all, "username"),
    Dimension.POOL: ("pool_id", NodePool.objects.all, "name"),
    Dimension.GPU_MODEL: ("gpu_model", None, ""),
}
ROLLUP_DIMS = ("tenant_id", "project_id", "owner_id")
_WORKLOAD_ID = "workload_id"
# What every query also groups by, to price its rows.
_POOL_ID, _MODEL = "workload__pool_id", "gpu__model"
_CENT = Decimal("0.01")
_MICRO = Decimal("0.000001")
_HOUR = timedelta(hours=1)
_HALF_MINUTE = timedelta(seconds=30)
_IDS_PER_QUERY = 20_000  # allocations read by id per pair of queries: well under SQLite's 32,766 parameters
_WINDOWS_PER_QUERY = 48  # four columns each: far from Postgres' 1,664 in a query, and a query quick to build
_RANGES_APART = 4  # rollup ranges read a query each; more are read together (_rolled_up)

Window = tuple[datetime, datetime]  # [start, end)
Group = tuple[tuple[str, ...], int, str]  # (key, pool id, GPU model): a row of a report, as a price sees it


@dataclass
class Usage:
    """What one group used in a period: seconds of each resource, utilization figures and cost.

    `memory_gib_seconds` is GiB held times seconds; `utilization_minutes` sums
    each sampled held minute's average utilization (percent).
    """

    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    memory_gib_seconds: float = 0.0
    sampled_gpu_seconds: float = 0.0
    utilization_minutes: float = 0.0
    idle_gpu_seconds: float = 0.0
    cost: Decimal = field(default_factory=Decimal)

    def add(self, other: Usage) -> None:
        self.gpu_seconds += other.gpu_seconds
        self.cpu_seconds += other.cpu_seconds
        self.memory_gib_seconds += other.memory_gib_seconds
        self.sampled_gpu_seconds += other.sampled_gpu_seconds
        self.utilization_minutes += other.utilization_minutes
        self.idle_gpu_seconds += other.idle_gpu_seconds
        self.cost += other.cost

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600

    @property
    def utilization(self) -> float | None:
        """Average utilization (percent) of the GPUs held, over the minutes that have a reading; None without any."""
        minutes = self.sampled_gpu_seconds / 60
        return self.utilization_minutes / minutes if minutes else None

    @property
    def idle_cost(self) -> Decimal:
        """The share of the GPU cost spent holding idle GPUs, at this row's average GPU price."""
        if not self.gpu_seconds:
            return Decimal(0)
        return (self.cost * Decimal(self.idle_gpu_seconds / self.gpu_seconds)).quantize(_CENT)


@dataclass(frozen=True)
class UsageRow:
    """One group of a report: the dimensions' values (in `Report.group_by` order) and what it used."""

    key: tuple[str, ...]
    usage: Usage


@dataclass(frozen=True)
class Report:
    """A usage report of one period: rows by `group_by`, their total, and (when asked for) a series by bucket."""

    period: Period
    group_by: tuple[str, ...]
    rows: list[UsageRow]
    total: Usage
    currency: str
    bucket: str = ""
    series: list[tuple[datetime, list[UsageRow]]] = field(default_factory=list)


def tenant_report(
    tenant: Tenant, period: Period, group_by: Sequence[str], *, now: datetime, bucket: str = ""
) -> Report:
    """Return what `tenant` used in `period`, grouped by `group_by` (Dimension values, not `tenant`)."""
    allocations = Allocation.all_tenants.filter(tenant_id=tenant.pk)  # the one tenant, named: fail closed
    return _report(allocations, {"tenant_id": tenant.pk}, period, group_by, now=now, bucket=bucket)


def platform_report(period: Period, group_by: Sequence[str], *, now: datetime, bucket: str = "") -> Report:
    """Return what every tenant used in `period`, grouped by `group_by`: operators' view."""
    return _report(Allocation.all_tenants.all(), {}, period, group_by, now=now, bucket=bucket)


def usage_by_hour(first: datetime, last: datetime) -> list[tuple[datetime, tuple[int, int, int], int, str, Usage]]:
    """Return what the ledger says was used in each UTC hour from `first` to `last` (hour starts, `last`
    excluded): (hour, (tenant, project, owner ids), pool id, GPU model, usage) per group held in that hour.

    The rule is the reports' own (`_held_by`), so an hour rolled up from
    these figures reads the same as the ledger does. The ledger is read
    whole once, for the allocations overlapping the hours; then a day of
    hours at a time, by id.
    """
    overlapping = Allocation.all_tenants.filter(_overlapping(first, last)).order_by()
    spans = list(overlapping.values_list("pk", "created_at", "released_at"))
    found = []
    for day in range(0, int((last - first) / _HOUR), 24):
        low = first + _HOUR * day
        hours = [low + _HOUR * index for index in range(min(24, int((last - low) / _HOUR)))]
        windows = [(hour, hour + _HOUR) for hour in hours]
        ids = sorted(pk for pk, created, released in spans if _overlaps(created, released, low, windows[-1][1]))
        parts: list[dict[Group, Usage]] = [defaultdict(Usage) for _ in windows]
        for chunk in _chunks(ids):
            _held_by(chunk, {}, windows, ROLLUP_DIMS, parts)
        for hour, part in zip(hours, parts, strict=True):
            for (key, pool_id, model), usage in part.items():
                tenant_id, project_id, owner_id = (int(value) for value in key)
                found.append((hour, (tenant_id, project_id, owner_id), pool_id, model, usage))
    return found


def _report(
    allocations: QuerySet[Allocation],
    scope: dict[str, Any],
    period: Period,
    group_by: Sequence[str],
    *,
    now: datetime,
    bucket: str,
) -> Report:
    dims = tuple(group_by)
    book = PriceBook.load()
    edges = bucket_edges(period, bucket) if bucket else [period.start, period.end]
    spans = [(low, min(high, now)) for low, high in pairwise(edges)]
    parts = _priced(allocations, scope, spans, dims, book, _settled())
    totals: dict[tuple[str, ...], Usage] = defaultdict(Usage)
    for part in parts:
        for key, usage in part.items():
            totals[key].add(usage)
    series = [(low, _rows(part)) for (low, _), part in zip(spans, parts, strict=True)] if bucket else []
    total = Usage()
    for usage in totals.values():
        total.add(usage)
    return Report(period, dims, _rows(totals), total, book.currency, bucket, series)


def _rows(usage_by_key: dict[tuple[str, ...], Usage]) -> list[UsageRow]:
    """Rows largest GPU use first, then by key: the order people read a report in."""
    rows = [UsageRow(key, usage) for key, usage in usage_by_key.items()]
    rows.sort(key=lambda row: (-row.usage.gpu_seconds, -row.usage.cpu_seconds, row.key))
    return rows


def _settled() -> Window | None:
    """Return the hours the rollups may be read for ([from, until), see RollupMark), or None before any."""
    mark = RollupMark.objects.filter(pk=1).first()
    if mark is None or mark.rolled_from is None or mark.settled_until is None:
        return None
    return mark.rolled_from, mark.settled_until


def _usage_between(
    allocations: QuerySet[Allocation],
    scope: dict[str, Any],
    start: datetime,
    end: datetime,
    dims: tuple[str, ...],
    book: PriceBook,
    *,
    settled: Window | None = None,
) -> dict[tuple[str, ...], Usage]:
    """Usage by `dims` key in [start, end), priced: `_priced` for one span."""
    return _priced(allocations, scope, [(start, end)], dims, book, settled)[0]


def _priced(
    allocations: QuerySet[Allocation],
    scope: dict[str, Any],
    spans: Sequence[Window],
    dims: tuple[str, ...],
    book: PriceBook,
    settled: Window | None,
) -> list[dict[tuple[str, ...], Usage]]:
    """Usage by `dims` key in each of `spans` (disjoint, earliest first; empty ones give nothing), priced once
    per piece of constant prices.

    `scope` narrows the GPU minutes and the rollups to what `allocations`
    holds. A piece's whole hours in `settled` come from the rollups (none
    without it), the rest from the ledger; the rollups of every span are
    read in one query and the ledger's windows of every span together
    (`_held`), so a report's buckets cost no more queries than its total.
    """
    pieces = [
        (index, low, high)
        for index, (start, end) in enumerate(spans)
        if start < end
        for low, high in pairwise([start, *book.changes_within(start, end), end])
    ]
    rolled = [_rolled_hours(low, high, dims, settled) for _, low, high in pieces]
    edges: list[tuple[int, Window]] = []  # (piece, window) read from the ledger
    for number, ((_, low, high), (first, last)) in enumerate(zip(pieces, rolled, strict=True)):
        whole = first >= last
        edges += [(number, (a, b)) for a, b in (((low, high),) if whole else ((low, first), (last, high))) if a < b]
    ranges = [(number, hours) for number, hours in enumerate(rolled) if hours[0] < hours[1]]
    found: list[dict[Group, Usage]] = [defaultdict(Usage) for _ in pieces]
    held = _held(allocations, scope, [window for _, window in edges], dims) if edges else []
    for (number, _), part in zip(edges, held, strict=True):
        _merge(found[number], part)
    read = _rolled_up(scope, [hours for _, hours in ranges], dims) if ranges else []
    for (number, _), part in zip(ranges, read, strict=True):
        _merge(found[number], part)
    priced: list[dict[tuple[str, ...], Usage]] = [defaultdict(Usage) for _ in spans]
    for (index, low, _), part in zip(pieces, found, strict=True):
        for (key, pool_id, model), usage in part.items():
            usage.cost = book.cost(usage, pool_id=pool_id, gpu_model=model, at=low)
            priced[index][key].add(usage)
    return priced


def _merge(into: dict[Group, Usage], part: dict[Group, Usage]) -> None:
    for group, usage in part.items():
        into[group].add(usage)


def _rolled_hours(start: datetime, end: datetime, dims: tuple[str, ...], settled: Window | None) -> Window:
    """Return the whole settled hours inside [start, end) as [first, last): empty (first >= last) when none."""
    if settled is None or Dimension.WORKLOAD in dims:
        return start, start
    first, last = _floor_hour(start), _floor_hour(end)
    if first < start:
        first += _HOUR
    return max(first, settled[0]), min(last, settled[1])


def _floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _rolled_up(scope: dict[str, Any], ranges: Sequence[Window], dims: tuple[str, ...]) -> list[dict[Group, Usage]]:
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


def _overlapping(start: datetime, end: datetime) -> Q:
    """Allocations held at some moment of [start, end)."""
    return Q(created_at__lt=end) & (Q(released_at__isnull=True) | Q(released_at__gt=start))


def _overlaps(created: datetime, released: datetime | None, start: datetime, end: datetime) -> bool:
    """Whether an allocation held from `created` to `released` (None: still held) is one `_overlapping` finds."""
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


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for first in range(0, len(ids), _IDS_PER_QUERY):
        yield ids[first : first + _IDS_PER_QUERY]


def _held(
    allocations: QuerySet[Allocation],
    scope: dict[str, Any],
    windows: Sequence[Window],
    dims: tuple[str, ...],
) -> list[dict[Group, Usage]]:
    """Return, for each of `windows` (disjoint, earliest first), the usage per group held in it.

    An allocation counts the seconds of it inside the window: one still
    open counts until the window's end. For each _WINDOWS_PER_QUERY
    windows, the allocations overlapping them are listed first (one query of
    the ledger alone), then read by id, a pair of queries per _IDS_PER_QUERY
    of them: told how few rows it joins, the planner looks their workloads
    and GPU minutes up by index instead of reading those tables whole.
    """
    found: list[dict[Group, Usage]] = []
    for first in range(0, len(windows), _WINDOWS_PER_QUERY):
        some = windows[first : first + _WINDOWS_PER_QUERY]
        overlapping = allocations.filter(_overlapping(some[0][0], some[-1][1])).order_by()
        parts: list[dict[Group, Usage]] = [defaultdict(Usage) for _ in some]
        for chunk in _chunks(sorted(overlapping.values_list("pk", flat=True))):
            _held_by(chunk, scope, some, dims, parts)
        found += parts
    return found


def _held_by(
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
        inside = _overlapping(start, end)
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


@dataclass(frozen=True)
class PriceBook:
    """Every price with its history, loaded once per report (a small table: a few rows per pool and model)."""

    prices: tuple[Price, ...]
    currency: str

    @classmethod
    def load(cls) -> PriceBook:
        return cls(tuple(Price.objects.order_by("effective_from", "id")), settings.ACCOUNTING_CURRENCY)

    def changes_within(self, start: datetime, end: datetime) -> list[datetime]:
        """Return the sorted moments strictly inside (start, end) at which some price takes effect."""
        return sorted({p.effective_from for p in self.prices if start < p.effective_from < end})

    def rate(self, resource: str, *, pool_id: int | None, gpu_model: str, at: datetime) -> Decimal:
        """Return the price per hour of `resource` in effect at `at`: the most specific key wins, else 0."""
        best: tuple[int, datetime] | None = None
        amount = Decimal(0)
        for price in self.prices:
            if price.resource != resource or price.effective_from > at:
                continue
            if price.pool_id not in (None, pool_id) or price.gpu_model not in ("", gpu_model):
                continue
            # Model beats pool: an H100 costs what an H100 costs, wherever it sits, unless the pool says otherwise.
            rank = (2 if price.gpu_model else 0) + (1 if price.pool_id else 0)
            if best is None or (rank, price.effective_from) >= best:
                best, amount = (rank, price.effective_from), price.amount_per_hour
        return amount

    def cost(self, usage: Usage, *, pool_id: int, gpu_model: str, at: datetime) -> Decimal:
        """Return what `usage` costs at the prices in effect at `at`, to the micro-unit (rounded on display)."""
        hours = {
            Resource.GPU: usage.gpu_seconds,
            Resource.CPU: usage.cpu_seconds,
            Resource.MEMORY: usage.memory_gib_seconds,
        }
        total = Decimal(0)
        for resource, seconds in hours.items():
            if seconds:
                rate = self.rate(
                    resource, pool_id=pool_id, gpu_model=gpu_model if resource == Resource.GPU else "", at=at
                )
                total += rate * Decimal(repr(seconds)) / Decimal(3600)
        return total.quantize(_MICRO)


def prices() -> QuerySet[Price]:
    """Return every price, newest date first within each key: prices are platform-wide, not tenant data."""
    return Price.objects.select_related("pool").order_by("resource", "pool__name", "gpu_model", "-effective_from")
