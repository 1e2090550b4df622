"""Hourly usage rollups: the ledger's figures per UTC hour, kept in UsageHour so long reports read few rows.

What is rolled up: for every closed UTC hour, per (tenant, project, owner,
pool, GPU model), the seconds of GPU, CPU and memory held and the held GPU
minutes' utilization figures, exactly as a report of that hour reads them
from the ledger: `selectors.usage_by_hour` runs the reports' own queries
(one rule, in one place).

Why a closed hour stays as it was rolled up: an allocation counts from
max(created_at, hour start) to min(released_at, hour end), and one still open
counts until the hour's end. Allocations are created and released with the
time of the change (jobs.services), so a release recorded after the hour
closed ends after it and leaves the hour as it was: once every allocation
overlapping the hour is either released or still open, nothing that happens
later changes it. Only what reaches the database late can:

- GPU minutes: agents send their samples with the next report and keep up
  to 10 minutes of them through an outage (inventory.agent.reporter), and
  the controller merges them after its queue;
- a release or an allocation stamped just before the hour's end becomes
  visible when its transaction commits, a moment after.

Hence the lateness window, LATE: every run rolls up again every hour that
closed less than LATE before (and those closed since the previous run),
and RollupMark.settled_until only passes an hour rolled up at least LATE
after it closed. Reports read the rollups up to there and the few hours
after from the ledger, so what they say never depends on a rollup taken too
early. LATE is two hours: twelve times the ten minutes of samples an agent
keeps through an outage, with room for a backed-up queue, and still only a
few hours for reports to read from the ledger. Anything later still (a ledger repaired by hand) is folded in by
calling `roll_up_hours` over the hours concerned.

GPU minutes are purged after TELEMETRY_RETENTION_DAYS; the rollups keep
their figures. Rolling up again an hour older than that loses them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction

from accounting import selectors
from accounting.models import RollupMark, UsageHour
from common.sql import column, field, placeholders, table
from jobs.models import Allocation

HOUR = timedelta(hours=1)
LATE = timedelta(hours=2)
BATCH_HOURS = 7 * 24  # hours rolled up per transaction: the ledger read whole once, then a day at a time by id
MAX_HOURS_PER_RUN = 7 * 24  # a first run over a long ledger catches up a week per run, not all at once
_COLUMNS: tuple[str, ...] = ("hour", "tenant", "project", "owner", "pool", "gpu_model", "gpu_seconds", "cpu_seconds")
_COLUMNS += ("memory_gib_seconds", "sampled_gpu_seconds", "utilization_minutes", "idle_gpu_seconds")


def roll_up_recent(*, now: datetime) -> int:
    """Roll up the hours closed by `now` from the last unsettled one (the ledger's first, the first time),
    at most MAX_HOURS_PER_RUN of them; return how many were rolled up. What the periodic task runs."""
    mark = RollupMark.objects.filter(pk=1).first()
    since = mark.settled_until if mark is not None and mark.settled_until is not None else _ledger_start()
    if since is None:
        return 0
    return roll_up_hours(since=since, until=min(_floor_hour(now), since + MAX_HOURS_PER_RUN * HOUR), now=now)


def roll_up_hours(*, since: datetime, until: datetime, now: datetime) -> int:
    """Replace the rollups of the UTC hours from `since` to `until` (both floored to the hour; hours not yet
    closed at `now` are left out) with what the ledger says now; return how many hours were rolled up.

    Idempotent: each batch of hours is deleted and inserted again in one
    transaction, under a lock on the mark, so concurrent runs take turns.
    The rolled-up hours stay one run: a range leaving a gap before or after
    them is widened to close it. Raises ValueError when `until` is before
    `since`.
    """
    if until < since:
        raise ValueError("until must not be before since")
    first, last = _floor_hour(since), min(_floor_hour(until), _floor_hour(now))
    mark = RollupMark.objects.get_or_create(pk=1)[0]
    start = first
    if mark.rolled_from is not None and mark.settled_until is not None:
        first, last, start = min(first, mark.settled_until), max(last, mark.rolled_from), mark.rolled_from
    # Hours before the rolled-up ones go newest first, so that each batch adjoins those already rolled up.
    batches = [*reversed(list(_batches(first, min(start, last)))), *_batches(max(first, start), last)]
    return sum(_roll_up_batch(low, high, now=now) for low, high in batches)


def _roll_up_batch(first: datetime, last: datetime, *, now: datetime) -> int:
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # Derived rows: a crash may lose this commit (mark and rows alike, so they stay consistent), and the
            # next run rolls those hours up again; no run needs to wait for the log to reach the disk.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        mark = RollupMark.objects.select_for_update().get(pk=1)
        found = selectors.usage_by_hour(first, last)
        UsageHour.all_tenants.filter(hour__gte=first, hour__lt=last).delete()  # every tenant's hours, named
        _insert([(hour, *ids, pool_id, model, *_figures(usage)) for hour, ids, pool_id, model, usage in found])
        old = mark.settled_until if mark.settled_until is not None else first
        mark.rolled_from = first if mark.rolled_from is None else min(mark.rolled_from, first)
        mark.settled_until = settled_after(old, first, last, cutoff=_floor_hour(now - LATE))
        mark.save()
    return int((last - first) / HOUR)


def _insert(rows: list[tuple[Any, ...]]) -> None:
    """Insert UsageHour rows (values of _COLUMNS): COPY on Postgres, an executemany elsewhere. bulk_create's
    per-field preparation took longer than the database's own work at a week of a large fleet's hours."""
    columns = ", ".join(column(UsageHour, name) for name in _COLUMNS)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.copy(f"COPY {table(UsageHour)} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            return
        hour = field(UsageHour, "hour")
        prepared = [(hour.get_db_prep_value(row[0], connection), *row[1:]) for row in rows]
        values = placeholders(len(_COLUMNS))
        sql = f"INSERT INTO {table(UsageHour)} ({columns}) VALUES ({values})"  # noqa: S608 -- names from the model's metadata; values are parameters
        cursor.executemany(sql, prepared)


def _figures(usage: selectors.Usage) -> tuple[float, ...]:
    return (
        usage.gpu_seconds,
        usage.cpu_seconds,
        usage.memory_gib_seconds,
        usage.sampled_gpu_seconds,
        usage.utilization_minutes,
        usage.idle_gpu_seconds,
    )


def settled_after(settled: datetime, first: datetime, last: datetime, *, cutoff: datetime) -> datetime:
    """Return where the settled hours end once the hours [first, last) were rolled up at a time when the
    hours before `cutoff` had been closed for the lateness window; they ended at `settled` before.

    The settled hours are a prefix: they end at the first hour that was
    rolled up too early (or never).
    """
    if first > settled:
        return settled  # an unsettled hour is left before these: nothing after it can count
    fresh = max(first, min(last, cutoff))  # [first, fresh) are settled now, [fresh, last) are not
    return fresh if fresh < last else max(settled, last)


def _batches(first: datetime, last: datetime) -> Iterator[tuple[datetime, datetime]]:
    low = first
    while low < last:
        high = min(low + BATCH_HOURS * HOUR, last)
        yield low, high
        low = high


def _ledger_start() -> datetime | None:
    """Return the start of the hour of the ledger's first allocation, or None while there is none."""
    first = Allocation.all_tenants.order_by("created_at").values_list("created_at", flat=True).first()
    return None if first is None else _floor_hour(first)


def _floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
