"""The agent's sampler and heartbeat: GPU samples every second to the live views, reports to the controller.

Every `sample_seconds` the reporter reads the GPUs and publishes the
samples to the channel layer group of the node. Every `heartbeat_seconds`
(and at once when a sample shows a GPU fault) it sends the controller a
report with the latest samples and the history of every sample taken since
the last report that got through, which the controller rolls up per minute.
The first sample of a new wall-clock minute also sends a report, so the
controller holds a minute's samples a second or two after it ends.

Sending never blocks sampling for long: a failed send is logged, its
history kept and sent with the next report. History unsent for longer than
`max_backlog_seconds` (a long controller or broker outage) is dropped,
oldest first, so a report's size stays bounded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from inventory.agent import AGENT_VERSION
from inventory.drivers.base import GpuProbe, GpuSample
from inventory.health import assess_sample

log = logging.getLogger(__name__)

Report = dict[str, Any]
SendReport = Callable[[Report], None]
Publish = Callable[[str, list[dict[str, Any]]], None]
HistoryPoint = tuple[float, float, int | None, float | None, float | None]
"""One sample in a report's history: (timestamp, utilization_gpu, memory_used_mib, power_w, temperature_c)."""

# Ten minutes of 1 Hz samples of 8 GPUs is about 200 KB of JSON: a report that size still goes through.
MAX_BACKLOG_SECONDS = 600.0


def node_gpu_group(node: str) -> str:
    """Return the channel layer group that receives every GPU sample of `node`."""
    return f"gpus.node.{node}"


def history_point(sample: GpuSample) -> HistoryPoint | None:
    """Return the history entry of `sample`, or None when it has no utilization reading (a lost GPU)."""
    if sample.lost or sample.utilization_gpu is None:
        return None
    return (sample.timestamp, sample.utilization_gpu, sample.memory_used_mib, sample.power_w, sample.temperature_c)


class Reporter:
    """Samples a node's GPUs and reports them; `tick` does one round, `run` loops until stopped.

    `clock` paces the heartbeat (monotonic by default); minutes follow the
    samples' own timestamps, which the probe takes from the wall clock.
    """

    def __init__(
        self,
        *,
        node: str,
        probe: GpuProbe,
        send_report: SendReport,
        publish: Publish | None = None,
        sample_seconds: float = 1.0,
        heartbeat_seconds: float = 5.0,
        max_backlog_seconds: float = MAX_BACKLOG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node, self.probe = node, probe
        self.send_report, self.publish = send_report, publish
        self.sample_seconds, self.heartbeat_seconds = sample_seconds, heartbeat_seconds
        self.max_backlog_seconds = max_backlog_seconds
        self.clock = clock
        self.last_report_at: float | None = None
        self.latest: list[dict[str, Any]] = []
        self.history: dict[str, deque[HistoryPoint]] = {}
        self.minute: int | None = None
        self.stopped = threading.Event()

    def tick(self) -> bool:
        """Sample once, publish, and report when due, on a new minute or a faulty GPU; return whether it reported."""
        samples = self.probe.sample()
        self.latest = [asdict(sample) for sample in samples]
        if self.publish is not None and self.latest:
            self._safely(self.publish, node_gpu_group(self.node), self.latest)
        new_minute = self._remember(samples)
        now = self.clock()
        faulty = any(assess_sample(sample) is not None for sample in self.latest)
        due = self.last_report_at is None or now - self.last_report_at >= self.heartbeat_seconds
        if not (faulty or due or new_minute):
            return False
        if faulty or due:
            # A minute flush leaves the heartbeat's phase alone: nodes' heartbeats stay spread over
            # the interval instead of all lining up on the minute.
            self.last_report_at = now
        if self._safely(self.send_report, self.report()):
            self.history.clear()
        return True

    def report(self) -> Report:
        """Return the report: node, agent version, send time, the latest samples and the unsent history."""
        return {
            "node": self.node,
            "agent_version": AGENT_VERSION,
            "sent_at": time.time(),
            "samples": self.latest,
            "history": {uuid: [list(point) for point in points] for uuid, points in self.history.items()},
        }

    def _remember(self, samples: list[GpuSample]) -> bool:
        """Add `samples` to the unsent history; return whether they start a new minute after unsent ones."""
        if not samples:
            return False
        newest = max(sample.timestamp for sample in samples)
        minute, previous = int(newest // 60), self.minute
        self.minute = minute
        rolled_over = previous is not None and minute != previous and bool(self.history)
        oldest_kept = newest - self.max_backlog_seconds
        for sample in samples:
            point = history_point(sample)
            if point is None:
                continue
            points = self.history.setdefault(sample.uuid, deque())
            points.append(point)
            while points[0][0] < oldest_kept:
                points.popleft()
        return rolled_over

    def run(self) -> None:
        """Tick every `sample_seconds` until `stop` is called."""
        while not self.stopped.is_set():
            started = self.clock()
            self._safely(self.tick)
            self.stopped.wait(max(0.0, self.sample_seconds - (self.clock() - started)))

    def stop(self) -> None:
        self.stopped.set()

    def start_thread(self) -> threading.Thread:
        """Run the loop on a daemon thread and return it."""
        thread = threading.Thread(target=self.run, name=f"agent-reporter-{self.node}", daemon=True)
        thread.start()
        return thread

    def _safely(self, call: Callable[..., Any], *args: Any) -> bool:
        """Call `call`; return whether it returned (False when it raised, which is logged)."""
        # The loop must survive a broker or channel-layer outage: the next
        # report carries the state again, and the history kept meanwhile.
        try:
            call(*args)
        except Exception:
            log.exception("agent %s: %s failed", self.node, getattr(call, "__name__", "call"))
            return False
        return True
