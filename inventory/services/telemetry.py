"""What agents report: heartbeats with the latest GPU samples, and the GPU faults they reveal.

A report is a JSON dict `{"node", "agent_version", "sent_at", "samples": [GpuSample as dict]}`.
Reports are applied in batches with a fixed number of queries per batch
(not per node), so one controller keeps up with thousands of agents.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from inventory.choices import GpuHealth, NodeState
from inventory.health import assess_sample, worsens
from inventory.mailbox import fresh
from inventory.models import Gpu, Node
from inventory.selectors import UNKNOWN_AGENTS_KEY
from inventory.services.nodes import record_node_event, resume_node, transition_node
from tenants.context import SYSTEM


def _remember_unknown(names: set[str], now: datetime) -> None:
    """Keep the names of agents that report for unregistered nodes, for the registration page."""
    seen: dict[str, str] = cache.get(UNKNOWN_AGENTS_KEY) or {}
    seen.update({name: now.isoformat() for name in names})
    cache.set(UNKNOWN_AGENTS_KEY, dict(sorted(seen.items())[-50:]), timeout=3600)


def _store_samples(rows: list[tuple[float | None, int | None, dict[str, Any], datetime, int]]) -> None:
    """Write (utilization, memory used, sample, time, GPU id) rows with one prepared UPDATE.

    `bulk_update` builds a CASE expression per row and field, which costs
    milliseconds per GPU in Python; a parameterized executemany is
    pipelined by the driver and costs microseconds.
    """
    table = connection.ops.quote_name(Gpu._meta.db_table)
    # The only interpolated part is the model's own table name, quoted by the backend.
    sql = (
        f"UPDATE {table} SET utilization = %s, memory_used_mb = %s, last_sample = %s, last_sample_at = %s WHERE id = %s"  # noqa: S608
    )
    last_sample_at = Gpu._meta.get_field("last_sample_at")
    with connection.cursor() as cursor:
        cursor.executemany(
            sql,
            [
                (util, mem, json.dumps(sample), last_sample_at.get_db_prep_value(at, connection), gpu_id)
                for util, mem, sample, at, gpu_id in rows
            ],
        )


def _apply_samples(nodes: dict[str, Node], reports: list[dict[str, Any]], now: datetime) -> list[tuple[Gpu, dict]]:
    """Store the latest sample of every GPU reported; return (gpu, sample) pairs that call for a health change."""
    by_uuid = {
        gpu.uuid: gpu
        for gpu in Gpu.objects.filter(node__in=list(nodes.values()), present=True).only(
            "id", "uuid", "node_id", "index", "health"
        )
    }
    rows: list[tuple[float | None, int | None, dict[str, Any], datetime, int]] = []
    faults: list[tuple[Gpu, dict]] = []
    for report in reports:
        for sample in report.get("samples") or []:
            gpu = by_uuid.get(str(sample.get("uuid")))
            if gpu is None or gpu.node_id != nodes[report["node"]].pk:
                continue
            rows.append(
                (_number(sample.get("utilization_gpu")), _integer(sample.get("memory_used_mb")), sample, now, gpu.pk)
            )
            if worsens(gpu.health, assess_sample(sample)):
                faults.append((gpu, sample))
    if rows:
        _store_samples(rows)
    return faults


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _integer(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


def fail_gpu(gpu: Gpu, *, health: GpuHealth, reason: str) -> None:
    """Mark `gpu` degraded or failed; a failed GPU cordons its ready node. Must run inside a transaction."""
    updated = (
        Gpu.objects.filter(pk=gpu.pk)
        .exclude(health=health)
        .update(health=health, health_reason=reason, health_changed_at=timezone.now())
    )
    if not updated:
        return
    node = Node.objects.select_for_update().get(pk=gpu.node_id)
    record_node_event(
        node, kind="gpu.health_changed", gpu=gpu, message=f"GPU {gpu.index} {health}: {reason}", data={"reason": reason}
    )
    if health == GpuHealth.FAILED and node.state == NodeState.READY:
        transition_node(
            node, NodeState.CORDONED, actor=SYSTEM, reason=f"GPU {gpu.index} failed: {reason}", action="node.cordon"
        )


def record_heartbeats(reports: list[dict[str, Any]]) -> int:
    """Apply a batch of agent reports; return how many came from registered nodes.

    Updates last heartbeat and agent version, stores the latest GPU samples,
    brings unreachable nodes back and acts on GPU faults. Reports for
    unknown or retired nodes are ignored (their names are remembered for the
    registration page). Idempotent: replaying a report changes nothing new.
    """
    now = timezone.now()
    reports = [r for r in reports if isinstance(r.get("node"), str)]
    names = {r["node"] for r in reports}
    nodes = {n.name: n for n in Node.objects.filter(name__in=names).exclude(state=NodeState.RETIRED)}
    if names - nodes.keys():
        _remember_unknown(names - nodes.keys(), now)
    reports = [r for r in reports if r["node"] in nodes]
    if not reports:
        return 0
    with transaction.atomic():
        Node.objects.filter(pk__in=[n.pk for n in nodes.values()]).update(last_heartbeat_at=now)
        _record_agent_versions(nodes, reports)
        faults = _apply_samples(nodes, reports, now)
        for gpu, sample in faults:
            verdict = assess_sample(sample)
            assert verdict is not None
            fail_gpu(gpu, health=verdict.health, reason=verdict.reason)
        for node in nodes.values():
            if node.state == NodeState.UNREACHABLE:
                resume_node(Node.objects.select_for_update().get(pk=node.pk))
    return len(reports)


def _record_agent_versions(nodes: dict[str, Node], reports: list[dict[str, Any]]) -> None:
    for report in reports:
        node = nodes[report["node"]]
        version = str(report.get("agent_version") or "")[:40]
        if version and version != node.agent_version:
            Node.objects.filter(pk=node.pk).update(agent_version=version)


def apply_agent_reports(reports: list[dict[str, Any]]) -> int:
    """Apply the reports agents posted, skipping stale ones; return how many were applied.

    A report older than the heartbeat timeout (a backlog after a controller
    outage) proves nothing about the node now, so it must not revive it.
    """
    max_age = float(settings.NODE_HEARTBEAT_TIMEOUT_SECONDS)
    return record_heartbeats([report for report in reports if fresh(report, max_age=max_age)])
