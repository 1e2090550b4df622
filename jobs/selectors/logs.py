"""Scoped reads of workload logs: pages for the API and the pages, and whole logs for downloads.

Lines are stored in `LogChunk` rows as `[seq, timestamp, stream, text,
attempt, replica]` lists, numbered per workload from 1
(`jobs.services.logs` writes them); retention may have removed the oldest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

from django.db.models import F, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from jobs.choices import TERMINAL_STATES
from jobs.models import LogChunk, Replica, ReplicaState, Workload
from tenants.scoping import tenant_scope

# How long after its end an ended replica's output may still be on its way (and is read again from the node
# meanwhile, `jobs.services.reconcile`): past it, what is stored is all there will ever be.
OUTPUT_WAIT_WINDOW = timedelta(minutes=10)


class LogLine(TypedDict):
    """One stored output line of a workload; `seq` numbers lines per workload from 1."""

    seq: int
    timestamp: str
    stream: str
    text: str
    attempt: int
    replica: int


@dataclass(frozen=True)
class LogPage:
    """Lines of a workload's log, where to continue (`next_since`), and whether no more will come."""

    lines: list[LogLine]
    next_since: int
    complete: bool


def _log_line(stored: list[Any]) -> LogLine:
    seq, timestamp, stream, text, attempt, replica = stored
    return {"seq": seq, "timestamp": timestamp, "stream": stream, "text": text, "attempt": attempt, "replica": replica}


def _chunk_lines(workload: Workload, start: int, limit: int) -> list[list[Any]]:
    """Return the stored lines of the chunks that may hold seq `start` .. `start + limit - 1`, in order."""
    chunks = LogChunk.objects.filter(workload_id=workload.pk)
    # The chunk holding `start` begins at or before it: one backward index probe finds it, so the
    # range read below stays bounded however long the log is.
    holder = chunks.filter(first_seq__lte=start).order_by("-first_seq").values("first_seq")[:1]
    wanted = chunks.filter(first_seq__gte=Coalesce(Subquery(holder), Value(0)), first_seq__lt=start + limit)
    rows = list(wanted.order_by("first_seq").values_list("lines", flat=True))
    if not rows:
        # Retention removed everything from `start` on for `limit` lines: go on from the oldest line kept.
        oldest = chunks.filter(first_seq__gt=start).order_by("first_seq").values_list("first_seq", flat=True).first()
        if oldest is not None:
            wanted = chunks.filter(first_seq__gte=oldest, first_seq__lt=oldest + limit)
            rows = list(wanted.order_by("first_seq").values_list("lines", flat=True))
    return [line for lines in rows for line in lines]


def log_lines_after(workload: Workload, *, since: int, limit: int) -> list[LogLine]:
    """Return up to `limit` of the workload's log lines numbered above `since`, in order.

    `workload` must come from the active tenant's scope; the lines are read
    through it too. Lines removed by retention are skipped.
    """
    start = since + 1
    return [_log_line(line) for line in _chunk_lines(workload, start, limit) if line[0] >= start][:limit]


def replicas_with_output_short(now: datetime) -> QuerySet[Replica]:
    """Return the replicas that ended within OUTPUT_WAIT_WINDOW whose stored output stops short of its end.

    A replica's exit report says where its shipped output ends (`log_end`),
    and it travels on another queue than the output: for a moment after an
    exit, the last batches may not be stored yet. Looks across tenants.
    """
    return (
        Replica.all_tenants.filter(state=ReplicaState.EXITED, finished_at__gte=now - OUTPUT_WAIT_WINDOW)
        .exclude(log_end="")
        .exclude(log_cursor=F("log_end"))
    )


def output_settled(workload: Workload, *, now: datetime | None = None) -> bool:
    """Return whether `workload` has ended (as stored now) and all its output is stored: no more lines will come.

    Reads its state in its tenant's scope; callers hold the access check.
    """
    with tenant_scope(workload.tenant):
        state = Workload.objects.filter(pk=workload.pk).values_list("state", flat=True).first()
    if state not in TERMINAL_STATES:
        return False
    return not replicas_with_output_short(now or timezone.now()).filter(workload_id=workload.pk).exists()


def workload_log(workload: Workload, *, since: int | None, limit: int) -> LogPage:
    """Return a page of the workload's log: the lines after `since`, or the last `limit` lines when it is None.

    `next_since` is the last line's number (the `since` to poll with next;
    when no line came back, where this page started). `complete` says the
    workload has ended, all its output is stored (`output_settled`) and no
    line after `next_since` is, so polling can stop.
    """
    after = max(workload.log_seq - limit, 0) if since is None else since
    lines = log_lines_after(workload, since=after, limit=limit)
    next_since = lines[-1]["seq"] if lines else after
    return LogPage(lines=lines, next_since=next_since, complete=_read_to_the_end(workload, next_since))


def _read_to_the_end(workload: Workload, next_since: int) -> bool:
    if workload.state not in TERMINAL_STATES:
        return False  # as read with the page: a workload that had not ended then may still write
    # Settled first, then the count: every line stored before the output settled is counted, so a page that
    # reaches that count has them all (the other order could miss a batch stored in between).
    if replicas_with_output_short(timezone.now()).filter(workload_id=workload.pk).exists():
        return False
    stored = Workload.objects.filter(pk=workload.pk).values_list("log_seq", flat=True).first() or 0
    return next_since >= stored


def iter_log_lines(workload: Workload, *, chunks_per_read: int = 200) -> Iterator[LogLine]:
    """Yield every stored line of `workload` in order, reading `chunks_per_read` chunks at a time.

    For downloads: a streamed response is consumed after the view returned
    and its tenant scope ended, so each read enters the workload's own
    tenant scope for the length of that read only (never across a yield).
    `workload` must have been fetched through the active scope.
    """
    tenant = workload.tenant
    after = 0
    while True:
        with tenant_scope(tenant):
            rows = list(
                LogChunk.objects.filter(workload_id=workload.pk, first_seq__gt=after)
                .order_by("first_seq")
                .values_list("first_seq", "lines")[:chunks_per_read]
            )
        for _, lines in rows:
            yield from (_log_line(line) for line in lines)
        if len(rows) < chunks_per_read:
            return
        after = rows[-1][0]
