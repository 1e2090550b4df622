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
(`accounting.models.UsageHour`, written by `accounting.services.rollups` with
`usage_by_hour`, this package's own rule): the whole settled hours of each
piece of constant prices are read from them, and only the ragged edges, the
recent hours and groupings by workload (which the rollups do not keep) from
the ledger; one rollup query and one pass over the ledger serve a whole
report, every bucket of it. Both are summed before pricing, so the figures
are the same whichever path served them, but for the order in which
floating-point seconds were added (see tests/accounting/test_rollups.py).

Beside the reports, one module a concern: `budgets` (each budget's use in
its current period), `budget_notes` (what the budgets say at launch),
`requests` (requests for more), `prices`, `decayed` (fair share's history)
and `jobs_port` (accounting's answers to the jobs app, `jobs.accounting_port`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from django.db.models import QuerySet

from accounting.periods import Period, bucket_edges
from accounting.selectors.figures import Group, Report, Usage, UsageRow, Window
from accounting.selectors.ledger import ROLLUP_DIMS, chunks, held, held_by, overlapping, overlaps
from accounting.selectors.prices import PriceBook, prices, prices_visible_to
from accounting.selectors.requests import requests_awaiting_operators, requests_in_scope
from accounting.selectors.rolled import rolled_hours, rolled_up, settled_hours
from jobs.models import Allocation
from tenants.models import Tenant
from tenants.scoping import tenant_scope

__all__ = [
    "PriceBook",
    "Report",
    "Usage",
    "UsageRow",
    "platform_report",
    "prices",
    "prices_visible_to",
    "requests_awaiting_operators",
    "requests_in_scope",
    "tenant_report",
    "usage_by_hour",
]

_HOUR = timedelta(hours=1)


def tenant_report(
    tenant: Tenant, period: Period, group_by: Sequence[str], *, now: datetime, bucket: str = ""
) -> Report:
    """Return what `tenant` used in `period`, grouped by `group_by` (Dimension values, not `tenant`)."""
    # Built under `tenant`'s scope, so it stays the one tenant's when a CSV streams after the request's ended.
    with tenant_scope(tenant):
        allocations = Allocation.objects.all()
    return _report(allocations, {"tenant_id": tenant.pk}, period, group_by, now=now, bucket=bucket)


def platform_report(period: Period, group_by: Sequence[str], *, now: datetime, bucket: str = "") -> Report:
    """Return what every tenant used in `period`, grouped by `group_by`: operators' view."""
    return _report(Allocation.all_tenants.all(), {}, period, group_by, now=now, bucket=bucket)


def usage_by_hour(first: datetime, last: datetime) -> list[tuple[datetime, tuple[int, int, int], int, str, Usage]]:
    """Return what the ledger says was used in each UTC hour from `first` to `last` (hour starts, `last`
    excluded): (hour, (tenant, project, owner ids), pool id, GPU model, usage) per group held in that hour.

    The rule is the reports' own (`held_by`), so an hour rolled up from
    these figures reads the same as the ledger does. The ledger is read
    whole once, for the allocations overlapping the hours; then a day of
    hours at a time, by id.
    """
    spans = list(
        Allocation.all_tenants.filter(overlapping(first, last))
        .order_by()
        .values_list("pk", "created_at", "released_at")
    )
    found = []
    for day in range(0, int((last - first) / _HOUR), 24):
        low = first + _HOUR * day
        hours = [low + _HOUR * index for index in range(min(24, int((last - low) / _HOUR)))]
        windows = [(hour, hour + _HOUR) for hour in hours]
        ids = sorted(pk for pk, created, released in spans if overlaps(created, released, low, windows[-1][1]))
        parts: list[dict[Group, Usage]] = [defaultdict(Usage) for _ in windows]
        for chunk in chunks(ids):
            held_by(chunk, {}, windows, ROLLUP_DIMS, parts)
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
    parts = _priced(allocations, scope, spans, dims, book, settled_hours())
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
    (`held`), so a report's buckets cost no more queries than its total.
    """
    pieces = [
        (index, low, high)
        for index, (start, end) in enumerate(spans)
        if start < end
        for low, high in pairwise([start, *book.changes_within(start, end), end])
    ]
    rolled = [rolled_hours(low, high, dims, settled) for _, low, high in pieces]
    edges: list[tuple[int, Window]] = []  # (piece, window) read from the ledger
    for number, ((_, low, high), (first, last)) in enumerate(zip(pieces, rolled, strict=True)):
        whole = first >= last
        edges += [(number, (a, b)) for a, b in (((low, high),) if whole else ((low, first), (last, high))) if a < b]
    ranges = [(number, hours) for number, hours in enumerate(rolled) if hours[0] < hours[1]]
    found: list[dict[Group, Usage]] = [defaultdict(Usage) for _ in pieces]
    from_ledger = held(allocations, scope, [window for _, window in edges], dims) if edges else []
    for (number, _), part in zip(edges, from_ledger, strict=True):
        _merge(found[number], part)
    read = rolled_up(scope, [hours for _, hours in ranges], dims) if ranges else []
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
