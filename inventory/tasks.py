"""Controller tasks of the inventory app (queue `control`): thin, named, idempotent."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from common import control
from common.control import CoalescingTask
from common.task_names import (
    APPLY_HEARTBEATS,
    CHECK_NODES,
    COMPLETE_PROVISIONING,
    HEARTBEAT_SIMULATED_NODES,
    MEASURE_VOLUME_USAGE,
    PROVISION_NODE,
    PURGE_TELEMETRY,
)
from inventory import mailbox, selectors, services
from inventory.agent.reporter import node_gpu_group
from inventory.agent.simulated import simulated_reports
from inventory.agent.transport import publish_samples
from inventory.services.rollups import purge_expired_minutes

HEARTBEAT_LOCK = "inventory:apply-heartbeats"
# Seconds a batch of reports may take before the next is drained at once, and the most one run drains for.
BURST_SECONDS = 0.5
BURST_LIMIT_SECONDS = 30.0


@shared_task(name=PROVISION_NODE)
def provision_node(node_id: int, attempt: int) -> bool:
    """Send the provisioning probe of `attempt` to the node's agent; False when the attempt is stale."""
    return services.dispatch_probe(node_id, attempt)


@shared_task(name=COMPLETE_PROVISIONING)
def complete_provisioning(report: dict[str, Any], node_id: int, attempt: int) -> str | None:
    """Apply the agent's probe report (linked after its `ProbeNode`); return the node's new state."""
    node = services.complete_provisioning(node_id=node_id, attempt=attempt, report=report)
    return node.state if node is not None else None


@shared_task(name=APPLY_HEARTBEATS, base=CoalescingTask)
def apply_heartbeats() -> int:
    """Periodic (every second): apply every agent report waiting in the mailbox as one batch.

    Single-flight: a run that finds another one in progress returns at once.
    """
    return apply_waiting_reports(wait_seconds=0.0) or 0


def apply_waiting_reports(*, wait_seconds: float) -> int | None:
    """Apply every report waiting in the mailbox; return how many, or None if another run held it throughout.

    A batch that took longer than BURST_SECONDS to apply (the minute
    flushes of every agent) is followed at once by another: the reports
    that piled up meanwhile would otherwise wait for the next beat. A run
    in progress elsewhere is waited for up to `wait_seconds`.
    """
    deadline = time.monotonic() + wait_seconds
    while not cache.add(HEARTBEAT_LOCK, 1, timeout=60):
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
    try:
        applied, deadline = 0, time.monotonic() + BURST_LIMIT_SECONDS
        while True:
            started = time.monotonic()
            taken = mailbox.drain_reports(services.apply_agent_reports)
            applied += taken
            if not taken or time.monotonic() - started < BURST_SECONDS or time.monotonic() > deadline:
                return applied
    finally:
        cache.delete(HEARTBEAT_LOCK)


@shared_task(name=HEARTBEAT_SIMULATED_NODES, base=CoalescingTask)
def heartbeat_simulated_nodes() -> int:
    """Report for the simulated nodes, which have no agent process of their own, and publish their samples
    to the live views as an agent does, so the demo fleet's charts and heatmap move."""
    reports = simulated_reports(selectors.simulated_nodes_to_heartbeat())
    for report in reports:
        publish_samples(node_gpu_group(report["node"]), report["samples"])
    return services.record_heartbeats(reports)


@shared_task(name=CHECK_NODES, base=CoalescingTask)
def check_nodes() -> dict[str, Any]:
    """Periodic: unreachable nodes, stalled provisioning, drained nodes reaching maintenance.

    A node is judged only after every report already in the mailbox has been
    applied: a controller that fell behind must not mistake its own backlog
    for a silent node. When the mailbox cannot be drained now, or this
    process has not yet watched for a whole timeout (it just started), no
    node is judged this time.
    """
    timeout = settings.NODE_HEARTBEAT_TIMEOUT_SECONDS
    drained = apply_waiting_reports(wait_seconds=BURST_LIMIT_SECONDS)
    judge = drained is not None and control.watching_for(timeout)
    return {
        "unreachable": (
            services.mark_unreachable_nodes(timeout=timedelta(seconds=timeout), now=control.evidence_time())
            if judge
            else []
        ),
        "provisioning_failed": services.fail_stalled_provisioning(
            timeout=timedelta(seconds=settings.NODE_PROVISION_TIMEOUT_SECONDS)
        ),
        "maintenance": services.settle_draining_nodes(),
    }


@shared_task(name=PURGE_TELEMETRY, base=CoalescingTask, ignore_result=True)
def purge_telemetry() -> int:
    """Periodic (daily): delete per-minute GPU rollups older than TELEMETRY_RETENTION_DAYS."""
    return purge_expired_minutes(now=timezone.now())


@shared_task(name=MEASURE_VOLUME_USAGE, base=CoalescingTask, ignore_result=True)
def measure_volume_usage() -> int:
    """Measure every volume's use where the console reaches it; return how many were measured."""
    from inventory.services.volume_files import measure_usage

    return measure_usage()
