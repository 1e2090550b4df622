"""The agent's sampler and heartbeat: GPU samples every second to the live views, a report to the controller.

Every `sample_seconds` the reporter reads the GPUs and publishes the
samples to the channel layer group of the node. Every `heartbeat_seconds`
(and at once when a sample shows a GPU fault) it sends the controller a
report with the latest samples. Sending never blocks sampling for long: a
failed send is logged and retried with the next heartbeat.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from inventory.agent import AGENT_VERSION
from inventory.drivers.base import GpuProbe
from inventory.health import assess_sample

log = logging.getLogger(__name__)

Report = dict[str, Any]
SendReport = Callable[[Report], None]
Publish = Callable[[str, list[dict[str, Any]]], None]


def node_gpu_group(node: str) -> str:
    """Return the channel layer group that receives every GPU sample of `node`."""
    return f"gpus.node.{node}"


class Reporter:
    """Samples a node's GPUs and reports them; `tick` does one round, `run` loops until stopped."""

    def __init__(
        self,
        *,
        node: str,
        probe: GpuProbe,
        send_report: SendReport,
        publish: Publish | None = None,
        sample_seconds: float = 1.0,
        heartbeat_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node, self.probe = node, probe
        self.send_report, self.publish = send_report, publish
        self.sample_seconds, self.heartbeat_seconds = sample_seconds, heartbeat_seconds
        self.clock = clock
        self.last_report_at: float | None = None
        self.latest: list[dict[str, Any]] = []
        self.stopped = threading.Event()

    def tick(self) -> bool:
        """Sample once, publish, and report when due or when a GPU looks faulty; return whether it reported."""
        self.latest = [asdict(sample) for sample in self.probe.sample()]
        if self.publish is not None and self.latest:
            self._safely(self.publish, node_gpu_group(self.node), self.latest)
        now = self.clock()
        faulty = any(assess_sample(sample) is not None for sample in self.latest)
        if faulty or self.last_report_at is None or now - self.last_report_at >= self.heartbeat_seconds:
            self.last_report_at = now
            self._safely(self.send_report, self.report())
            return True
        return False

    def report(self) -> Report:
        """Return the heartbeat report: node, agent version, send time and the latest samples."""
        return {"node": self.node, "agent_version": AGENT_VERSION, "sent_at": time.time(), "samples": self.latest}

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

    def _safely(self, call: Callable[..., Any], *args: Any) -> None:
        # The loop must survive a broker or channel-layer outage: the next
        # heartbeat carries the state again.
        try:
            call(*args)
        except Exception:
            log.exception("agent %s: %s failed", self.node, getattr(call, "__name__", "call"))
