"""Storing one batch of a replica's output, only where it continues the replica's chain.

A batch names the cursor it starts after (`since`) and the cursor after its
last line (`cursor`); the replica's `log_cursor` row is the end of the chain
stored so far. A batch is stored only when it continues that chain, so a
redelivered Celery task or an agent that resumed from an older cursor cannot
store a line twice. Its lines get the workload's next sequence numbers in
the same step (on Postgres, in one statement). A malformed batch raises
LogBatchError before anything of it is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import OperationalError, connection, transaction

from common import fastpaths
from jobs import fast_sql, live
from jobs.models import LogChunk, Replica, Workload

log = logging.getLogger(__name__)

STREAMS = frozenset({"stdout", "stderr"})
# Lines longer than this many characters (16 Ki) keep their start and end around this marker.
MAX_LINE_CHARS = 16 * 1024
TRUNCATION_MARKER = " […truncated…] "
# Replica.log_cursor's column width.
MAX_CURSOR_CHARS = 100


class LogBatchError(ValueError):
    """A batch is malformed (a bug in the sender): nothing of it was stored."""


class _ChainRace(Exception):
    """Another ingest numbered lines between our read and our write: roll back and let the caller retry."""


# Postgres's deadlock_detected and serialization_failure: the batch's statement was rolled back whole.
_LOCK_CONFLICTS = frozenset({"40P01", "40001"})


def _lost_a_lock_conflict(error: OperationalError) -> bool:
    """Return whether `error` is Postgres ending our statement to break a lock conflict (safe to run again).

    The chain locks the replica and then its workload; a cancel or an exit
    report locks them the other way round, and Postgres aborts one of the two.
    """
    return getattr(error.__cause__, "sqlstate", None) in _LOCK_CONFLICTS


def truncate_line(text: str) -> str:
    """Return `text`, or for a longer one than MAX_LINE_CHARS its head and tail around TRUNCATION_MARKER."""
    if len(text) <= MAX_LINE_CHARS:
        return text
    keep = MAX_LINE_CHARS - len(TRUNCATION_MARKER)
    head = keep * 3 // 4
    return text[:head] + TRUNCATION_MARKER + text[len(text) - (keep - head) :]


def _clean(text: str) -> tuple[str, int]:
    """Return `text` as stored (truncated; NULs and lone surrogates replaced) and its UTF-8 size."""
    text = truncate_line(text)
    # Postgres's jsonb refuses NUL, and UTF-8 cannot carry a lone surrogate: either would fail
    # the insert and stall the replica's chain for good, so both become U+FFFD.
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        return text, len(text.encode())
    except UnicodeEncodeError:
        text = "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in text)
        return text, len(text.encode())


def _parse_timestamp(value: str, index: int) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise LogBatchError(f"lines[{index}][0]: {value!r} is not an RFC 3339 timestamp") from None
    # RFC 3339 always carries an offset; a bare one is read as UTC rather than the server's zone.
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class _Batch:
    """A checked batch: its lines as stored, their total size, and its earliest and latest timestamp."""

    rows: list[tuple[str, str, str]]
    size: int
    first_at: datetime
    last_at: datetime


def _checked(lines: Sequence[Sequence[str]]) -> _Batch:
    """Return the batch ready to store; raises LogBatchError naming the first bad line."""
    rows: list[tuple[str, str, str]] = []
    stamps: list[datetime] = []
    size = 0
    for index, line in enumerate(lines):
        if len(line) != 3 or not all(isinstance(part, str) for part in line):
            raise LogBatchError(f"lines[{index}]: expected [timestamp, stream, text] strings")
        timestamp, stream, text = line
        if stream not in STREAMS:
            raise LogBatchError(f"lines[{index}][1]: stream {stream!r} is not stdout or stderr")
        stamps.append(_parse_timestamp(timestamp, index))
        stored, length = _clean(text)
        rows.append((timestamp, stream, stored))
        size += length
    return _Batch(rows=rows, size=size, first_at=min(stamps), last_at=max(stamps))


def ingest_log_batch(
    *, workload_id: int, attempt: int, replica: int, since: str, cursor: str, lines: list[list[str]]
) -> int:
    """Store one batch of a replica's output if it continues the replica's chain; return the lines stored.

    `lines` are `[timestamp (RFC 3339), stream ("stdout" | "stderr"), text]`;
    texts over MAX_LINE_CHARS are truncated. The batch is accepted only when
    `since` equals the replica's stored `log_cursor` ("" = from the
    beginning): then its lines get the workload's next sequence numbers, are
    stored as one `LogChunk`, and the replica's cursor becomes `cursor`, all
    in one transaction. A batch that does not continue the chain (a
    duplicate, a replay from an older cursor) or names an unknown replica is
    dropped (returns 0). A statement Postgres aborts to break a deadlock is
    run again (outside a caller's transaction). Raises LogBatchError,
    storing nothing, for a malformed batch.
    """
    if len(cursor) > MAX_CURSOR_CHARS:
        raise LogBatchError(f"cursor: longer than {MAX_CURSOR_CHARS} characters")
    batch = _checked(lines) if lines else None
    for _ in range(3):
        try:
            if connection.vendor == "postgresql" and batch is not None and fastpaths.enabled(fastpaths.JOBS_SQL):
                return _store_in_one_statement(workload_id, attempt, replica, since, cursor, batch)
            return _store(workload_id, attempt, replica, since, cursor, batch)
        except _ChainRace:
            continue
        except OperationalError as error:
            # Inside a caller's transaction the whole of it is aborted: only the caller can run it again.
            if connection.in_atomic_block or not _lost_a_lock_conflict(error):
                raise
            log.info("log batch for %s/%s/%s lost a lock conflict; storing it again", workload_id, attempt, replica)
            continue
    # Only SQLite without row locks, or a storm of lock conflicts, loses three times in a row; the agent will resend.
    log.warning("log batch for %s/%s/%s lost the numbering race; dropped", workload_id, attempt, replica)
    return 0


def record_log_end(*, workload_id: int, attempt: int, replica: int, log_end: str) -> bool:
    """Record where the replica's shipped output ends (its exit report says); return whether it changed."""
    if len(log_end) > MAX_CURSOR_CHARS:
        return False
    rows = Replica.all_tenants.filter(workload_id=workload_id, attempt=attempt, index=replica).exclude(log_end=log_end)
    return rows.update(log_end=log_end) == 1


def _store_in_one_statement(
    workload_id: int, attempt: int, replica: int, since: str, cursor: str, batch: _Batch
) -> int:
    """`_store` on Postgres in one round trip (a busy workload ships five batches a second); same contract.

    The fast path `jobs_sql` (`jobs.fast_sql.continue_log_chain`); with it off, `_store` serves.
    """
    # No transaction block: the statement is its own (one round trip, not three), and after it
    # the lines are committed, so the live publish (on commit, or at once outside a transaction) may go.
    first = fast_sql.continue_log_chain(
        workload_id,
        attempt,
        replica,
        since=since,
        cursor=cursor,
        lines=batch.rows,
        first_at=batch.first_at,
        last_at=batch.last_at,
        size=batch.size,
    )
    if first is None:
        _log_drop(workload_id, attempt, replica, since)
        return 0
    stored = [[first + i, ts, stream, text, attempt, replica] for i, (ts, stream, text) in enumerate(batch.rows)]
    live.publish_log_lines(workload_id, stored)
    return len(stored)


@transaction.atomic
def _store(
    workload_id: int,
    attempt: int,
    replica: int,
    since: str,
    cursor: str,
    batch: _Batch | None,
) -> int:
    # The replica row first (the order the replica reports lock in): the compare-and-swap on its
    # cursor is what makes a second delivery of the same batch a no-op, even when both run at once.
    chain = Replica.all_tenants.filter(workload_id=workload_id, attempt=attempt, index=replica, log_cursor=since)
    if chain.update(log_cursor=cursor) != 1:
        _log_drop(workload_id, attempt, replica, since)
        return 0
    if batch is None:
        return 0
    workload = Workload.all_tenants.select_for_update().filter(pk=workload_id).values("tenant_id", "log_seq").first()
    if workload is None:
        return 0
    first = workload["log_seq"] + 1
    last = workload["log_seq"] + len(batch.rows)
    # Checked update: under the row lock it always matches; without one (SQLite) a concurrent
    # ingest makes it miss, and the whole transaction (the cursor move too) is retried.
    if Workload.all_tenants.filter(pk=workload_id, log_seq=workload["log_seq"]).update(log_seq=last) != 1:
        raise _ChainRace
    stored = [[first + i, ts, stream, text, attempt, replica] for i, (ts, stream, text) in enumerate(batch.rows)]
    LogChunk.all_tenants.create(
        tenant_id=workload["tenant_id"],
        workload_id=workload_id,
        first_seq=first,
        last_seq=last,
        first_at=batch.first_at,
        last_at=batch.last_at,
        lines=stored,
        size_bytes=batch.size,
    )
    live.publish_log_lines(workload_id, stored)
    return len(stored)


def _log_drop(workload_id: int, attempt: int, replica: int, since: str) -> None:
    """Say why a batch was dropped: an unknown replica is worth a warning, a replayed batch is routine."""
    known = Replica.all_tenants.filter(workload_id=workload_id, attempt=attempt, index=replica).exists()
    if not known:
        log.warning("log batch for unknown replica %s/%s/%s dropped", workload_id, attempt, replica)
    else:
        log.info(
            "log batch for %s/%s/%s after %r does not continue the chain; dropped", workload_id, attempt, replica, since
        )
