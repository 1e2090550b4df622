"""Report periods: named months or a custom window, in UTC, each a half-open interval [start, end).

Accounting cuts time in UTC so that a tenant's month is the same for every
reader and a report of the past never moves with someone's time zone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.core.exceptions import ValidationError

from common.errors import FieldErrors, add_errors, invalid, raise_errors

NAMED_PERIODS = ("this-month", "last-month", "custom")
MAX_DAYS = 400  # a year and a little: longer reports are a series of periods, not one query
BUCKETS = ("day", "month")


@dataclass(frozen=True)
class Period:
    """A report's window [start, end) in UTC, and how it was asked for (`name`)."""

    name: str
    start: datetime
    end: datetime

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


def month_start(moment: datetime) -> datetime:
    """Return the first instant of `moment`'s UTC month."""
    moment = moment.astimezone(UTC)
    return datetime(moment.year, moment.month, 1, tzinfo=UTC)


def next_month(start: datetime) -> datetime:
    """Return the first instant of the month after the one `start` (a month's first instant) begins."""
    return datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)


def _moment(field: str, value: str) -> datetime:
    """Parse a date (its midnight, UTC) or an ISO 8601 time (UTC when it names no offset)."""
    try:
        if len(value) == 10:
            return datetime.combine(date.fromisoformat(value), time(), tzinfo=UTC)
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise invalid(field, "invalid_time", f"Give a date (2026-11-01) or an ISO 8601 time, not {value!r}.") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def resolve_period(*, name: str = "", start: str = "", end: str = "", now: datetime) -> Period:
    """Return the period asked for: `name` this-month (the default), last-month, or custom from `start` to `end`.

    A custom period needs `start` and `end` (dates or ISO times, `end`
    exclusive, at most MAX_DAYS apart); `start` or `end` alone makes the period
    custom. Raises ValidationError naming every failing field at once (rules
    `invalid_choice`, `required`, `invalid_time`, `end_before_start`, `too_long`).
    """
    name = name or ("custom" if start or end else "this-month")
    if name not in NAMED_PERIODS:
        raise invalid("period", "invalid_choice", f"Choose one of {', '.join(NAMED_PERIODS)}, not {name!r}.")
    if name == "this-month":
        first = month_start(now)
        return Period(name, first, next_month(first))
    if name == "last-month":
        this = month_start(now)
        return Period(name, month_start(this - timedelta(days=1)), this)
    return _custom(start, end)


def _custom(start: str, end: str) -> Period:
    errors: FieldErrors = {}
    moments: dict[str, datetime] = {}
    for field, value in (("start", start), ("end", end)):
        if not value:
            add_errors(errors, invalid(field, "required", "A custom period needs a start and an end."))
            continue
        try:
            moments[field] = _moment(field, value)
        except ValidationError as error:
            add_errors(errors, error)
    if len(moments) == 2:
        span = moments["end"] - moments["start"]
        if span <= timedelta(0):
            add_errors(errors, invalid("end", "end_before_start", "The end must come after the start."))
        elif span > timedelta(days=MAX_DAYS):
            add_errors(errors, invalid("end", "too_long", f"A period spans at most {MAX_DAYS} days."))
    raise_errors(errors)
    return Period("custom", moments["start"], moments["end"])


def bucket_edges(period: Period, bucket: str) -> list[datetime]:
    """Return the edges cutting `period` into UTC days or months: start, every boundary inside, end."""
    edges = [period.start]
    if bucket == "day":
        cursor = datetime.combine(period.start.date(), time(), tzinfo=UTC) + timedelta(days=1)
        step = lambda moment: moment + timedelta(days=1)  # noqa: E731  # one line, read once below
    else:
        cursor = next_month(month_start(period.start))
        step = next_month
    while cursor < period.end:
        edges.append(cursor)
        cursor = step(cursor)
    edges.append(period.end)
    return edges
