"""A node's message of batches, stored in their order per replica.

A batch whose predecessor is still on its way (in a message another worker
is storing right now) waits briefly in place while the other replicas go on;
one that overlaps the stored chain is cut to continue it (`aligned`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from django.db.models import Q

from jobs.models import Replica
from jobs.services.logs.chain import LogBatchError, ingest_log_batch

log = logging.getLogger(__name__)


def ingest_log_batches(
    batches: Sequence[Mapping[str, Any]], *, wait_seconds: float, poll_seconds: float = 0.02
) -> list[dict[str, Any]]:
    """Store a node's batches (`ingest_log_batch` arguments each) in their order per replica; return the rest.

    A batch that does not continue its replica's chain usually has its
    predecessor in a message another worker is storing right now: the
    replica waits in place (at most `wait_seconds` for the whole message,
    looking at the waiting replicas' cursors with one query every
    `poll_seconds`) while the other replicas go on. Returns the batches
    still waiting then (a replica's from the blocked one on), for the
    caller to retry later. A batch whose lines were all stored already is
    skipped at once; a replay without `marks` ends up waiting too and is
    dropped by the caller's retry limit. Batches of unknown replicas and
    malformed ones are logged and skipped: they must not cost the other
    replicas their lines.
    """
    queues: dict[_ReplicaKey, deque[dict[str, Any]]] = {}
    for batch in batches:
        queues.setdefault(replica_key(batch), deque()).append(dict(batch))
    deadline = time.monotonic() + wait_seconds
    while queues:
        cursors = _cursors(list(queues))
        progressed = False
        for key in list(queues):
            progressed |= _store_ready(key, queues[key], cursors.get(key))
            if not queues[key]:
                del queues[key]
        if not queues or time.monotonic() >= deadline:
            break
        if not progressed:
            time.sleep(poll_seconds)
    return [batch for pending in queues.values() for batch in pending]


_ReplicaKey = tuple[int, int, int]


def replica_key(batch: Mapping[str, Any]) -> _ReplicaKey:
    """Return the (workload id, attempt, replica index) a batch belongs to."""
    return (int(batch["workload_id"]), int(batch["attempt"]), int(batch["replica"]))


def _cursors(keys: list[_ReplicaKey]) -> dict[_ReplicaKey, str]:
    """Return the stored log cursor of each of these (workload, attempt, replica) that exists, in one query."""
    condition = Q()
    for workload_id, attempt, replica in keys:
        condition |= Q(workload_id=workload_id, attempt=attempt, index=replica)
    rows = Replica.all_tenants.filter(condition).values_list("workload_id", "attempt", "index", "log_cursor")
    return {(workload_id, attempt, index): cursor for workload_id, attempt, index, cursor in rows}


def _store_ready(key: _ReplicaKey, pending: deque[dict[str, Any]], cursor: str | None) -> bool:
    """Store the replica's batches that continue its chain from `cursor`, in order; return whether any went."""
    if cursor is None:
        log.warning("%d log batches for unknown replica %s/%s/%s dropped", len(pending), *key)
        pending.clear()
        return True
    progressed = False
    while pending:
        batch = aligned(pending[0], cursor)
        if batch is None:
            return progressed  # it starts further on: its predecessor has not come yet
        if not _stored_or_skipped(batch):
            return progressed  # someone else moved the chain meanwhile: read the cursors again
        pending.popleft()
        cursor = str(batch.get("cursor"))
        progressed = True
    return progressed


def aligned(batch: Mapping[str, Any], cursor: str) -> dict[str, Any] | None:
    """Return `batch` cut to continue a chain stored up to `cursor`, or None when it starts further on.

    A batch starting at `cursor` continues the chain whole. The agent also
    sends each line's own cursor (`marks`), so a batch that overlaps
    `cursor` continues it from the line after it: output read again from a
    stored cursor (`request_output_resend`) comes in other batch boundaries
    than the batches of the same lines already on their way, and both must
    fit. A batch ending at `cursor` was stored already and comes back with
    no lines.
    """
    since, end, lines = str(batch.get("since")), str(batch.get("cursor")), list(batch.get("lines") or [])
    marks = [str(mark) for mark in batch.get("marks") or []]
    if since == cursor:
        return dict(batch)
    if end == cursor:
        return {**batch, "since": cursor, "lines": [], "marks": []}
    if cursor in marks and len(marks) == len(lines):
        cut = marks.index(cursor) + 1
        return {**batch, "since": cursor, "lines": lines[cut:], "marks": marks[cut:]}
    return None


def _stored_or_skipped(batch: dict[str, Any]) -> bool:
    """Store one batch; return False only when its chain moved on before it (it must wait or go)."""
    try:
        stored = ingest_log_batch(
            workload_id=int(batch["workload_id"]),
            attempt=int(batch["attempt"]),
            replica=int(batch["replica"]),
            since=str(batch["since"]),
            cursor=str(batch["cursor"]),
            lines=list(batch.get("lines") or []),
        )
    except (LogBatchError, KeyError, TypeError, ValueError) as error:
        log.warning("malformed log batch for workload %s skipped: %s", batch.get("workload_id"), error)
        return True
    return bool(stored) or not batch.get("lines")
