"""RFC 3339 nanosecond timestamps and the log cursors built on them."""

from __future__ import annotations

import pytest

from inventory.drivers.base import PermanentDriverError
from inventory.drivers.timestamps import CursorFilter, format_ns, make_cursor, parse_cursor, parse_ns


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("1970-01-01T00:00:01.5Z", 1_500_000_000),
        ("2024-02-29T12:00:00.000000001Z", 1_709_208_000_000_000_001),
        ("2024-02-29T13:00:00.25+01:00", 1_709_208_000_250_000_000),
    ],
)
def test_parse_reads_trimmed_fractions_and_offsets(text: str, ns: int) -> None:
    assert parse_ns(text) == ns


def test_format_round_trips_with_nine_digits() -> None:
    assert format_ns(1_709_208_000_000_000_001) == "2024-02-29T12:00:00.000000001Z"
    assert parse_ns(format_ns(123_456_789_012_345_678)) == 123_456_789_012_345_678


def test_trimmed_timestamps_compare_by_time_not_by_text() -> None:
    # "…00.12Z" sorts after "…00.123Z" as text, but is earlier.
    assert parse_ns("2024-01-01T00:00:00.12Z") < parse_ns("2024-01-01T00:00:00.123Z")


def test_a_bad_cursor_is_a_permanent_error() -> None:
    with pytest.raises(PermanentDriverError) as refused:
        parse_cursor("yesterday")
    assert refused.value.code == "invalid_cursor"


def test_lines_sharing_a_timestamp_get_distinct_cursors_and_resume_exactly() -> None:
    stamps = ["2024-01-01T00:00:01Z", "2024-01-01T00:00:02Z", "2024-01-01T00:00:02Z", "2024-01-01T00:00:02Z"]
    stamps.append("2024-01-01T00:00:03Z")
    everything = CursorFilter(None)
    cursors = [everything.accept(stamp) for stamp in stamps]
    assert cursors == [stamps[0], stamps[1], make_cursor(stamps[1], 1), make_cursor(stamps[1], 2), stamps[4]]
    for seen, cursor in enumerate(cursors):
        after = CursorFilter(cursor)
        resumed = [c for c in (after.accept(stamp) for stamp in stamps) if c is not None]
        assert resumed == cursors[seen + 1 :], f"resuming after line {seen}"
