"""Report periods: named months and custom windows in UTC, every bad field named at once."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.core.exceptions import ValidationError

from accounting.periods import Period, bucket_edges, resolve_period

NOW = datetime(2026, 1, 15, 12, 30, tzinfo=UTC)


def test_named_months_are_utc_months_and_december_wraps() -> None:
    this = resolve_period(now=NOW)
    assert (this.start, this.end) == (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC))
    last = resolve_period(name="last-month", now=NOW)
    assert (last.start, last.end) == (datetime(2025, 12, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))
    december = resolve_period(now=datetime(2025, 12, 31, 23, 59, tzinfo=UTC))
    assert december.end == datetime(2026, 1, 1, tzinfo=UTC)


def test_a_custom_period_takes_dates_or_times_and_an_offset_becomes_utc() -> None:
    period = resolve_period(start="2026-01-03", end="2026-01-04T06:00:00+02:00", now=NOW)
    assert period == Period("custom", datetime(2026, 1, 3, tzinfo=UTC), datetime(2026, 1, 4, 4, tzinfo=UTC))


def test_every_bad_field_is_named_at_once() -> None:
    with pytest.raises(ValidationError) as caught:
        resolve_period(start="yesterday", now=NOW)
    errors = caught.value.error_dict
    assert [e.code for e in errors["start"]] == ["invalid_time"]
    assert [e.code for e in errors["end"]] == ["required"]
    with pytest.raises(ValidationError) as caught:
        resolve_period(start="2026-01-05", end="2026-01-05", now=NOW)
    assert [e.code for e in caught.value.error_dict["end"]] == ["end_before_start"]
    with pytest.raises(ValidationError) as caught:
        resolve_period(start="2024-01-01", end="2026-01-01", now=NOW)
    assert [e.code for e in caught.value.error_dict["end"]] == ["too_long"]
    with pytest.raises(ValidationError) as caught:
        resolve_period(name="last-week", now=NOW)
    assert [e.code for e in caught.value.error_dict["period"]] == ["invalid_choice"]


def test_buckets_cut_at_utc_days_and_months() -> None:
    period = resolve_period(start="2026-01-30T12:00", end="2026-02-02", now=NOW)
    assert bucket_edges(period, "day") == [
        datetime(2026, 1, 30, 12, tzinfo=UTC),
        datetime(2026, 1, 31, tzinfo=UTC),
        datetime(2026, 2, 1, tzinfo=UTC),
        datetime(2026, 2, 2, tzinfo=UTC),
    ]
    assert bucket_edges(period, "month") == [period.start, datetime(2026, 2, 1, tzinfo=UTC), period.end]
