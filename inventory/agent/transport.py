"""How an agent's reports leave the process: the controller's mailbox, and channel layer groups for browsers."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from inventory.mailbox import post_report


def send_report_to_controller(report: dict[str, Any]) -> None:
    """Post one heartbeat report to the controller's mailbox (applied in batches, once a second)."""
    post_report(report)


def publish_samples(group: str, samples: list[dict[str, Any]]) -> None:
    """Send the latest samples to the channel layer group watching the node."""
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(group, {"type": "gpu.samples", "samples": samples})
