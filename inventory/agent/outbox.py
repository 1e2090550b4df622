"""How the agent's execution reports reach the controller: `report`, and the node's `LogOutbox`.

Every report is a Celery task sent to the controller's queues; the broker
keeps it while the controller is down. Log batches wait in the outbox and
leave together; every other report flushes the outbox first
(`inventory.agent.executor.Executor.report`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from common.protocol.messages import LogBatches

log = logging.getLogger(__name__)

# A busy node's log batches leave together at most this often (a quiet node's at once).
SHIP_SECONDS = 0.1
# Batches the outbox keeps while the broker is unreachable; past this the newest are dropped (reconcile
# re-watches the replica from the stored cursor, so the runtime's own log fills the gap).
OUTBOX_CAPACITY = 5000

# A report (an exit, a start, the node's inventory) is what the controller cannot learn otherwise before
# the next reconcile: while the broker restarts, its send is retried for about a minute, not given up
# after Celery's default of well under a second. The agent's threads can afford to wait; web requests
# keep the short default.
REPORT_PUBLISH_RETRY = {"max_retries": 60, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0}


def report(task: str, **kwargs: Any) -> None:
    """Send one report to the controller; the broker keeps it while the controller is down.

    Log batches travel on the ingest queue, every other report on `control`
    (`common.control.queue_for`), so output never delays an exit report's turn.
    Raises what the broker raises once REPORT_PUBLISH_RETRY is spent.
    """
    from celery import current_app as app

    from common.control import queue_for

    app.send_task(task, kwargs=kwargs, queue=queue_for(task), retry=True, retry_policy=REPORT_PUBLISH_RETRY)


class LogOutbox:
    """The node's outgoing log batches: sent together, in order, and always before any other report.

    Watchers hand over their chained batches; a thread sends whatever
    waits as one `jobs.ingest_log_batches` message, at once when the node
    is quiet and at most every SHIP_SECONDS when it is busy. A node running
    fifty chatty replicas then sends ten messages a second instead of two
    hundred and fifty, and the controller's cost per message (a task
    dispatch) is paid once for all of them. Other reports flush the outbox
    first, so the controller never hears of an exit before the output that
    preceded it. A failed send keeps the batches for the next attempt.
    """

    def __init__(self, send: Callable[..., None]) -> None:
        self._send = send
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def put(self, batch: dict[str, Any]) -> None:
        """Queue one chained batch (a `LogBatch` in its wire form) for the next send."""
        with self._lock:
            if len(self._pending) >= OUTBOX_CAPACITY:
                log.warning("log outbox full: a batch of %s lines is dropped", len(batch.get("lines") or []))
                return
            self._pending.append(batch)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="log-outbox", daemon=True)
                self._thread.start()
        self._wake.set()

    def flush(self) -> None:
        """Send every waiting batch now, as one message; on failure keep them and log."""
        with self._lock:
            if not self._pending:
                return
            try:
                self._send(LogBatches.TASK, batches=self._pending)
            except Exception:
                log.exception("sending %d log batches failed; they are kept for the next attempt", len(self._pending))
                return
            self._pending = []

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            self.flush()
            time.sleep(SHIP_SECONDS)
