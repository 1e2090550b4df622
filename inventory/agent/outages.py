"""When the node's runtimes could not be reached: outages noted, waited out, and remembered.

An engine outage (a Docker Engine restart) cuts starts and log follows
short; the executor notes it on the first failed call, waits it out on a
thread of its own, and asks the controller to reconcile once the runtime
answers. The last few outages are remembered so an exit that happened
during one says its output may be incomplete (OUTPUT_GAP_NOTE).
"""

from __future__ import annotations

import math
import threading
import time

from inventory.agent.replicas import CALL_TIMEOUT
from inventory.drivers.base import DriverError, Runtime
from inventory.drivers.timestamps import parse_ns

# While a runtime cannot be reached it is asked again this often; once it answers, the controller is asked
# to reconcile the node at once rather than at its next period (starts and watches cut short resume).
RECOVERY_POLL_SECONDS = 1.0
# What a replica's exit says when it ended while its runtime could not be reached: a Docker Engine reads a
# container's output, and one restarted after the container exited never reads what was printed meanwhile.
OUTPUT_GAP_NOTE = (
    "It exited while the node's container engine was down: what it printed after the engine stopped may be missing."
)
_REMEMBERED_OUTAGES = 20


class RuntimeOutages:
    """The outages of each runtime (kind, node): the one being waited out now, and the last few before it."""

    def __init__(self) -> None:
        # Per runtime, the last outages as [first failure, answered again] in epoch seconds; an end of inf is
        # an outage being waited out now.
        self._windows: dict[tuple[str, str], list[list[float]]] = {}
        self._lock = threading.Lock()

    def begin(self, kind: str, node: str) -> bool:
        """Note a failed call to that runtime; return whether it starts an outage (none was being waited out)."""
        with self._lock:
            windows = self._windows.setdefault((kind, node), [])
            if windows and windows[-1][1] == math.inf:
                return False
            windows.append([time.time(), math.inf])
            del windows[:-_REMEMBERED_OUTAGES]
            return True

    def wait_out(self, kind: str, node: str, runtime: Runtime) -> None:
        """Ask `runtime` every RECOVERY_POLL_SECONDS until it answers, then end its outage.

        Raises what the runtime raises other than a `DriverError`; the
        outage ends then too, so the next failure waits anew.
        """
        try:
            while True:
                try:
                    runtime.list_managed(timeout=CALL_TIMEOUT)
                    return
                except DriverError:
                    time.sleep(RECOVERY_POLL_SECONDS)
        finally:
            with self._lock:
                self._windows[(kind, node)][-1][1] = time.time()  # ended, or given up: the next failure waits anew

    def ongoing(self, kind: str, node: str) -> bool:
        """Whether an outage of that runtime is being waited out now."""
        with self._lock:
            windows = self._windows.get((kind, node), [])
            return bool(windows) and windows[-1][1] == math.inf

    def covers(self, kind: str, node: str, finished_at: str | None) -> bool:
        """Whether `finished_at` (RFC 3339) falls in an outage of that runtime; False when missing or unreadable."""
        if not finished_at:
            return False
        try:
            moment = parse_ns(finished_at) / 1e9
        except ValueError:
            return False
        with self._lock:
            windows = [tuple(window) for window in self._windows.get((kind, node), [])]
        # The first failure is noticed a moment after the engine stopped: a second of slack before it.
        return any(begin - 1.0 <= moment <= end for begin, end in windows)
