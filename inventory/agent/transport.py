"""How an agent's reports leave the process: the controller's mailbox, and channel layer groups for browsers."""

from __future__ import annotations

from typing import Any

from gpucloud.live_layer import publish
from inventory.mailbox import post_report


def send_report_to_controller(report: dict[str, Any]) -> None:
    """Post one heartbeat report to the controller's mailbox (applied in batches, once a second)."""
    post_report(report)


def publish_samples(group: str, samples: list[dict[str, Any]]) -> None:
    """Send the latest samples to the live layer's group watching the node (queued: never blocks sampling)."""
    publish([(group, {"type": "gpu.samples", "samples": samples})])
