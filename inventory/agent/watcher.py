"""One replica followed to its end: its output shipped in chained batches, its readiness and its exit reported.

The executor runs one `Watcher` on a thread per replica it starts or is
asked to watch. Output batches are chained by the runtime's log cursor
(`since` -> `cursor`) and handed to the node's `LogOutbox`; a watcher that
was superseded (`Executor.watch_handle(resend=True)`) stops shipping and
leaves the exit report to the one that took over.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from common.protocol.messages import ReplicaExited, ReplicaReady
from inventory.agent.checkpoints import checkpoint_thread
from inventory.agent.outages import OUTPUT_GAP_NOTE
from inventory.agent.replicas import CALL_TIMEOUT, ReplicaRef
from inventory.drivers.base import DriverError, DriverTimeout, Handle, PermanentDriverError, Runtime

if TYPE_CHECKING:
    from inventory.agent.executor import Executor

log = logging.getLogger(__name__)

FOLLOW_TIMEOUT = 300.0
# Output is shipped when this many lines are waiting or this many seconds passed since the first of them.
BATCH_LINES = 500
BATCH_SECONDS = 0.2
READY_TIMEOUT = 600.0


class Watcher:
    """Follows one replica: ships its output in chained batches, waits for readiness, reports its exit."""

    def __init__(
        self,
        executor: Executor,
        ref: ReplicaRef,
        handle: Handle,
        cursor: str,
        ready_path: str,
        secret: str,
        checkpoint_dir: str = "",
    ) -> None:
        self.executor = executor
        self.ref = ref
        self.handle = handle
        self.cursor = cursor
        self.ready_path = ready_path
        self.secret = secret
        self.checkpoint_dir = checkpoint_dir
        self.lines: queue.Queue[tuple[str, str, str, str] | None] = queue.Queue()
        # Set when a newer watcher of the same replica took over (`Executor.watch_handle(resend=True)`).
        self.superseded = threading.Event()
        self.ended = threading.Event()

    def run(self) -> None:
        """Follow the replica to its end; then the executor forgets this watcher (an agent runs for months)."""
        try:
            self._follow()
        finally:
            self.ended.set()
            self.executor.forget(self)

    def _follow(self) -> None:
        runtime = self.executor.runtime(self.ref.runtime, self.ref.node)
        if self.ready_path and self.handle.get("endpoint"):
            threading.Thread(target=self._await_ready, name=f"ready-{self.ref.name}", daemon=True).start()
        if self.checkpoint_dir:  # looked at until this watcher ends (its replica did, or another took over)
            checkpoint_thread(self.executor, self.ref, self.checkpoint_dir, self.ended)
        reader = threading.Thread(target=self._read, args=(runtime,), name=f"logs-{self.ref.name}", daemon=True)
        reader.start()
        self._ship()
        if self.superseded.is_set():
            return  # the watcher that took over reports the exit
        try:
            status = runtime.poll(self.handle, timeout=CALL_TIMEOUT)
        except DriverError as error:
            log.warning("polling %s after its output ended failed: %s", self.ref.name, error)
            self.executor.runtime_unreachable(self.ref.runtime, self.ref.node)
            return  # reconcile watches it again
        if status.state in ("exited", "missing"):
            message = status.message or ("" if status.state == "exited" else "Its container is gone.")
            if self.executor.ended_unheard(self.ref.runtime, self.ref.node, status.finished_at):
                message = f"{message} {OUTPUT_GAP_NOTE}".strip()
            self.executor.report(
                ReplicaExited(
                    **self.ref.ids(),
                    exit_code=status.exit_code,
                    message=message,
                    log_cursor=self.cursor,  # where its output ends: the controller checks it stored all of it
                    # A run its runtime lost track of ended in a way nobody knows: the controller runs it
                    # again as a new attempt rather than calling it failed.
                    unobserved=status.unobserved,
                )
            )

    def _read(self, runtime: Runtime) -> None:
        """Put every output line on the queue until the replica ends; None marks the end."""
        try:
            while True:
                try:
                    for line in runtime.logs(
                        self.handle, since=self.cursor or None, follow=True, timeout=FOLLOW_TIMEOUT
                    ):
                        if self.superseded.is_set():
                            return
                        self.lines.put((line.timestamp, line.stream, line.text, line.cursor))
                    return
                except DriverTimeout:
                    if self.superseded.is_set():
                        return
                    continue  # still running: follow on from the last line read
        except PermanentDriverError as error:
            log.info("output of %s is not available: %s", self.ref.name, error)
        except DriverError as error:
            log.warning("following %s failed: %s", self.ref.name, error)
            self.executor.runtime_unreachable(self.ref.runtime, self.ref.node)
        finally:
            self.lines.put(None)

    def _ship(self) -> None:
        """Send the queued lines in batches (full, or BATCH_SECONDS after their first line) until the end mark."""
        batch: list[tuple[str, str, str, str]] = []
        deadline: float | None = None
        while not self.superseded.is_set():
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                item = self.lines.get(timeout=wait)
            except queue.Empty:
                self._send(batch)
                batch, deadline = [], None
                continue
            if item is None:
                if batch:
                    self._send(batch)
                return
            batch.append(item)
            deadline = deadline if deadline is not None else time.monotonic() + BATCH_SECONDS
            if len(batch) >= BATCH_LINES:
                self._send(batch)
                batch, deadline = [], None

    def _send(self, batch: list[tuple[str, str, str, str]]) -> None:
        if self.superseded.is_set():
            return
        since, self.cursor = self.cursor, batch[-1][3]
        self.executor.outbox.put(
            {
                **self.ref.ids(),
                "since": since,
                "cursor": self.cursor,
                "lines": [[stamp, stream, text] for stamp, stream, text, _ in batch],
                # Each line's own cursor: a batch overlapping the stored chain continues it from there.
                "marks": [mark for _, _, _, mark in batch],
            }
        )

    def _await_ready(self) -> None:
        """Poll the service's status URL with the session's token until it answers 200, then report ready."""
        url = str(self.handle["endpoint"]).rstrip("/") + self.ready_path
        request = urllib.request.Request(url, headers={"Authorization": f"token {self.secret}"})  # noqa: S310 -- http only
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310 -- our own endpoint
                    if response.status == 200:
                        self.executor.report(ReplicaReady(**self.ref.ids()))
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if self.ended.is_set() or self.superseded.is_set():
                return
            time.sleep(0.1)
