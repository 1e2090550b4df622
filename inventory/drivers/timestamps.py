"""RFC 3339 timestamps with nanoseconds, as Docker writes them, and log cursors built on them."""

from __future__ import annotations

import calendar
import re
import time

from inventory.drivers.base import PermanentDriverError

_RFC3339 = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")
_NS = 1_000_000_000


def format_ns(ns: int) -> str:
    """Return `ns` nanoseconds since the epoch as RFC 3339 in UTC with nine fractional digits."""
    seconds, fraction = divmod(ns, _NS)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{fraction:09d}Z"


def parse_ns(text: str) -> int:
    """Return nanoseconds since the epoch of RFC 3339 `text`; raises ValueError when it is not one."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    year, month, day, hour, minute, second = (int(part) for part in match.groups()[:6])
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    zone = match.group(8)
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return seconds * _NS + int((match.group(7) or "0").ljust(9, "0"))


def make_cursor(timestamp: str, tie: int) -> str:
    """Return the cursor of a line: its timestamp, plus `#tie` when `tie` earlier lines share the timestamp."""
    return timestamp if tie == 0 else f"{timestamp}#{tie}"


def parse_cursor(cursor: str) -> tuple[int, int]:
    """Return (nanoseconds, tie) of a cursor from `make_cursor`; raises PermanentDriverError when malformed."""
    stamp, _, tie = cursor.partition("#")
    try:
        return parse_ns(stamp), int(tie or 0)
    except ValueError as error:
        raise PermanentDriverError(f"invalid log cursor {cursor!r}", code="invalid_cursor") from error


class CursorFilter:
    """Passes the lines that come strictly after a cursor, and computes each passing line's own cursor.

    Feed lines in the runtime's order (timestamps never decrease); lines
    with equal timestamps are told apart by their rank among them.
    """

    def __init__(self, since: str | None) -> None:
        self._after = parse_cursor(since) if since else None
        self._last_ns: int | None = None
        self._tie = 0

    def accept(self, timestamp: str, ns: int | None = None) -> str | None:
        """Return the cursor of the line stamped `timestamp` (`ns` if parsed), or None when not after `since`."""
        ns = parse_ns(timestamp) if ns is None else ns
        self._tie = self._tie + 1 if ns == self._last_ns else 0
        self._last_ns = ns
        if self._after is not None and (ns, self._tie) <= self._after:
            return None
        return make_cursor(timestamp, self._tie)
