"""How an agent's reports leave the process: the controller's mailbox, and channel layer groups for browsers."""

from __future__ import annotations

from typing import Any

from common.live_layer import publish
from inventory.mailbox import post_report


def send_report_to_controller(report: dict[str, Any]) -> None:
    """Post one heartbeat report to the controller's mailbox (applied in batches, once a second)."""
    post_report(report)


LIVE_SAMPLE_FIELDS = (
    "uuid",
    "index",
    "timestamp",
    "utilization_gpu",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "temperature_c",
)
"""What of a sample the live views show; the rest (processes, clocks, ECC, XIDs) goes to the controller only."""


def publish_samples(group: str, samples: list[dict[str, Any]]) -> None:
    """Send the latest samples, cut to LIVE_SAMPLE_FIELDS, to the live layer's group watching the node.

    Queued: never blocks sampling. Cutting here halves what Redis, every web
    process and every consumer handle each second for each node.
    """
    slim = [{name: sample.get(name) for name in LIVE_SAMPLE_FIELDS} for sample in samples]
    publish([(group, {"type": "gpu.samples", "samples": slim})])
