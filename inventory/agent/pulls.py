"""How a replica's image pull reaches the controller: `jobs.replica_pulling` reports, never in the pull's way.

The runtime calls the listener `PullReports.listener` gives it while it
pulls (about once a second, then once more when the pull is done). The
listener only notes the latest progress of the replica; a thread of its own
sends it, so a slow or restarting broker never holds up the download. What
waits is coalesced (a replica's newer progress replaces its older one: each
report carries the whole progress, not a difference), sends keep their
order, and every other report of the executor flushes what waits first, so
a pull's last report leaves before the replica's start report.

A report that cannot be sent is dropped: the next one carries the whole
progress again, and the controller takes a start report as the end of the
pull it never heard finish.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from common.protocol.messages import ReplicaPulling
from inventory.agent.replicas import ReplicaRef
from inventory.drivers.base import PullListener, PullProgress

log = logging.getLogger(__name__)

PULL_TASK = ReplicaPulling.TASK


def pull_report(ref: ReplicaRef, progress: PullProgress) -> dict[str, Any]:
    """Return the wire form of the `ReplicaPulling` report of `progress` for replica `ref`."""
    return ReplicaPulling(**ref.ids(), **dataclasses.asdict(progress)).to_wire()


class PullReports:
    """The node's waiting pull reports, the latest per replica, sent in order by a thread of their own."""

    def __init__(self, send: Callable[..., None]) -> None:
        self._send = send
        self._pending: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()  # guards `_pending` and the thread
        self._sending = threading.Lock()  # one flush at a time, so reports leave in the order they were taken
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def listener(self, ref: ReplicaRef) -> PullListener:
        """Return the listener to hand the runtime's `start` of replica `ref`; it returns at once."""

        def heard(progress: PullProgress) -> None:
            self.put(ref, progress)

        return heard

    def put(self, ref: ReplicaRef, progress: PullProgress) -> None:
        """Note the latest progress of `ref`'s pull, to be sent soon."""
        with self._lock:
            self._pending.pop(ref.name, None)  # re-inserted last: sends follow the order of the latest news
            self._pending[ref.name] = pull_report(ref, progress)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="pull-reports", daemon=True)
                self._thread.start()
        self._wake.set()

    def flush(self) -> None:
        """Send every waiting report now; one that fails is logged and dropped (see the module)."""
        with self._sending:
            with self._lock:
                waiting, self._pending = list(self._pending.values()), {}
            for report in waiting:
                try:
                    self._send(PULL_TASK, **report)
                except Exception:
                    log.exception("a pull report of workload %s could not be sent", report.get("workload_id"))

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            self.flush()
