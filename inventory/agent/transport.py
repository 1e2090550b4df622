"""How an agent's reports leave the process: Celery tasks to the controller, channel layer groups to browsers."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from gpucloud.celery import app


def send_report_to_controller(report: dict[str, Any]) -> None:
    """Send one heartbeat report to the controller's queue; it expires when it would arrive too late to matter."""
    app.send_task(
        "inventory.record_heartbeat",
        args=(report,),
        queue="control",
        expires=settings.NODE_HEARTBEAT_TIMEOUT_SECONDS,
    )


def publish_samples(group: str, samples: list[dict[str, Any]]) -> None:
    """Send the latest samples to the channel layer group watching the node."""
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(group, {"type": "gpu.samples", "samples": samples})
