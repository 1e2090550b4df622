"""Celery tasks of the notifications app (queue `control`): thin, named, idempotent."""

from __future__ import annotations

from celery import shared_task

from common.control import CoalescingTask
from common.task_names import SEND_DELIVERY, SEND_DUE_DELIVERIES
from notifications import services


@shared_task(name=SEND_DELIVERY, ignore_result=True)
def send_delivery(delivery_id: int) -> str | None:
    """Send one delivery if it is still due and unclaimed; return its state after, or None when it was not."""
    state = services.send_delivery(delivery_id=delivery_id)
    return None if state is None else str(state)


@shared_task(name=SEND_DUE_DELIVERIES, base=CoalescingTask, ignore_result=True)
def send_due_deliveries() -> dict[str, int]:
    """Send the retries that are due and whatever lost messages or dead workers left behind (periodic)."""
    return services.send_due_deliveries()
