"""The heartbeat mailbox: agents post reports to one broker queue; the controller drains it in batches.

A Celery task per heartbeat would cost the controller a task dispatch and a
transaction per node every few seconds; with a thousand nodes that alone
fills a core. Reports are instead plain messages on the broker queue
`gpucloud.heartbeats` (Redis in production, Celery's in-process transport
in embedded mode: the same code, only the broker URL differs), and one
controller task a second applies everything that arrived in one transaction.

Messages are acknowledged once applied, so a controller that dies
mid-batch loses nothing: the broker redelivers them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery import current_app as app

log = logging.getLogger(__name__)

QUEUE = "gpucloud.heartbeats"
MAX_BATCH = 5000


def post_report(report: dict[str, Any]) -> None:
    """Post one agent report to the controller's mailbox."""
    with app.connection_for_write() as connection:
        queue = connection.SimpleQueue(QUEUE, serializer="json")
        try:
            queue.put(report)
        finally:
            queue.close()


def drain_reports(apply: Callable[[list[dict[str, Any]]], Any], *, limit: int = MAX_BATCH) -> int:
    """Take up to `limit` waiting reports, pass them to `apply` as one batch, then acknowledge them.

    Returns how many were taken. When `apply` raises, the batch is still
    acknowledged (a heartbeat is superseded seconds later; a poison message
    must not block the mailbox) and the error is logged.
    """
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(QUEUE, serializer="json")
        try:
            messages: list[Any] = []
            while len(messages) < limit:
                try:
                    messages.append(queue.get_nowait())
                except queue.Empty:
                    break
            if not messages:
                return 0
            try:
                apply([m.payload for m in messages if isinstance(m.payload, dict)])
            except Exception:
                log.exception("applying %d heartbeat reports failed; they are dropped", len(messages))
            for message in messages:
                message.ack()
            return len(messages)
        finally:
            queue.close()


def fresh(report: dict[str, Any], *, max_age: float, now: float | None = None) -> bool:
    """Return whether `report` was sent within `max_age` seconds (a backlog must not revive dead nodes)."""
    sent_at = report.get("sent_at")
    if not isinstance(sent_at, int | float):
        return False
    return (now if now is not None else time.time()) - float(sent_at) <= max_age
