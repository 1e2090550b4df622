"""What agents report: heartbeats with the latest GPU samples, their sample history, and the GPU faults they reveal.

A report is a JSON dict `{"node", "agent_version", "sent_at", "samples":
[GpuSample as dict], "history": {uuid: [[timestamp, utilization, memory,
power, temperature], ...]}}`. Reports are applied in batches with a fixed
number of queries per batch (not per node), so one controller keeps up with
thousands of agents; the history goes to the per-minute rollups
(`inventory.services.rollups`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from inventory import fast_sql
from inventory.choices import GpuHealth, NodeState
from inventory.health import assess_sample, worsens
from inventory.mailbox import fresh
from inventory.models import Gpu, Node
from inventory.selectors import UNKNOWN_AGENTS_KEY
from inventory.services.nodes import record_node_event, resume_node, transition_node
from inventory.services.rollups import roll_up_reports
from notifications.services import notify_node_health
from tenants.context import SYSTEM


def _remember_unknown(names: set[str], now: datetime) -> None:
    """Keep the names of agents that report for unregistered nodes, for the registration page."""
    seen: dict[str, str] = cache.get(UNKNOWN_AGENTS_KEY) or {}
    seen.update({name: now.isoformat() for name in names})
    cache.set(UNKNOWN_AGENTS_KEY, dict(sorted(seen.items())[-50:]), timeout=3600)


def _store_samples(rows: list[tuple[float | None, int | None, dict[str, Any], int]], now: datetime) -> None:
    """Write (utilization, memory used, sample, GPU id) rows, sampled at `now`, in one statement per batch
    (`inventory.fast_sql.store_gpu_samples`). A GPU reported twice in a batch keeps its last sample."""
    latest = {gpu_id: (util, mem, sample) for util, mem, sample, gpu_id in rows}
    fast_sql.store_gpu_samples(latest, now)


@dataclass(frozen=True, slots=True)
class _GpuRow:
    """What a batch needs of a present GPU: its ids, index and health."""

    id: int
    node_id: int
    index: int
    health: str

    def as_gpu(self) -> Gpu:
        return Gpu(pk=self.id, node_id=self.node_id, index=self.index, health=self.health)


def _present_gpus(nodes: dict[str, Node]) -> dict[str, _GpuRow]:
    """Return the present GPUs of `nodes` by UUID (plain rows: a model instance per GPU costs more than the rest)."""
    gpus = Gpu.objects.filter(node__in=list(nodes.values()), present=True)
    rows = gpus.values_list("uuid", "id", "node_id", "index", "health")
    return {uuid: _GpuRow(pk, node_id, index, health) for uuid, pk, node_id, index, health in rows}


def _apply_samples(
    nodes: dict[str, Node], by_uuid: dict[str, _GpuRow], reports: list[dict[str, Any]], now: datetime
) -> list[tuple[_GpuRow, dict]]:
    """Store the latest sample of every GPU reported; return (gpu, sample) pairs that call for a health change."""
    rows: list[tuple[float | None, int | None, dict[str, Any], int]] = []
    faults: list[tuple[_GpuRow, dict]] = []
    for report in reports:
        for sample in report.get("samples") or []:
            gpu = by_uuid.get(str(sample.get("uuid")))
            if gpu is None or gpu.node_id != nodes[report["node"]].pk:
                continue
            rows.append(
                (_number(sample.get("utilization_gpu")), _integer(sample.get("memory_used_mib")), sample, gpu.id)
            )
            if worsens(gpu.health, assess_sample(sample)):
                faults.append((gpu, sample))
    if rows:
        _store_samples(rows, now)
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
    notify_node_health(
        node=node.name,
        summary=f"GPU {gpu.index} {health}: {reason}",
        data={"gpu": gpu.index, "health": str(health), "reason": reason},
    )
    if health == GpuHealth.FAILED and node.state == NodeState.READY:
        transition_node(
            node, NodeState.CORDONED, actor=SYSTEM, reason=f"GPU {gpu.index} failed: {reason}", action="node.cordon"
        )


def record_heartbeats(reports: list[dict[str, Any]], *, stale: list[dict[str, Any]] | None = None) -> int:
    """Apply a batch of agent reports; return how many came from registered nodes.

    Updates last heartbeat and agent version, stores the latest GPU samples,
    brings unreachable nodes back, acts on GPU faults, and rolls the samples'
    history up per minute. `stale` reports (too old to prove their node is
    alive) contribute their history to the rollups and nothing else. Reports
    for unknown or retired nodes are ignored (the names of fresh ones are
    remembered for the registration page). Idempotent: replaying a report
    changes nothing new.
    """
    now = timezone.now()
    reports = [r for r in reports if isinstance(r.get("node"), str)]
    stale = [r for r in stale or [] if isinstance(r.get("node"), str)]
    names = {r["node"] for r in reports}
    wanted = names | {r["node"] for r in stale}
    nodes = {n.name: n for n in Node.objects.filter(name__in=wanted).exclude(state=NodeState.RETIRED)}
    if names - nodes.keys():
        _remember_unknown(names - nodes.keys(), now)
    reports = [r for r in reports if r["node"] in nodes]
    stale = [r for r in stale if r["node"] in nodes]
    if not reports and not stale:
        return 0
    with transaction.atomic():
        gpus = _present_gpus(nodes)
        # Stale reports first: their samples are older, and the replay mark only moves forward.
        roll_up_reports(
            [*stale, *reports],
            nodes={name: node.pk for name, node in nodes.items()},
            gpus={uuid: (gpu.id, gpu.node_id) for uuid, gpu in gpus.items()},
            now=now,
        )
        if reports:
            _record_liveness({name: nodes[name] for name in names if name in nodes}, gpus, reports, now)
    return len(reports)


def _record_liveness(
    nodes: dict[str, Node], gpus: dict[str, _GpuRow], reports: list[dict[str, Any]], now: datetime
) -> None:
    """Apply what fresh reports prove: the nodes are alive, their versions, latest samples and GPU faults."""
    Node.objects.filter(pk__in=[n.pk for n in nodes.values()]).update(last_heartbeat_at=now)
    _record_agent_versions(nodes, reports)
    for gpu, sample in _apply_samples(nodes, gpus, reports, now):
        verdict = assess_sample(sample)
        assert verdict is not None
        fail_gpu(gpu.as_gpu(), health=verdict.health, reason=verdict.reason)
    for node in nodes.values():
        if node.state == NodeState.UNREACHABLE:
            resume_node(Node.objects.select_for_update().get(pk=node.pk))


def _record_agent_versions(nodes: dict[str, Node], reports: list[dict[str, Any]]) -> None:
    for report in reports:
        node = nodes[report["node"]]
        version = str(report.get("agent_version") or "")[:40]
        if version and version != node.agent_version:
            Node.objects.filter(pk=node.pk).update(agent_version=version)


def apply_agent_reports(reports: list[dict[str, Any]]) -> int:
    """Apply the reports agents posted; return how many were fresh enough to count as heartbeats.

    A report older than the heartbeat timeout (a backlog after a controller
    outage) proves nothing about the node now, so it must not revive it;
    its samples are still real, so their history is rolled up all the same.
    """
    max_age = float(settings.NODE_HEARTBEAT_TIMEOUT_SECONDS)
    fresh_reports: list[dict[str, Any]] = []
    stale: list[dict[str, Any]] = []
    for report in reports:
        (fresh_reports if fresh(report, max_age=max_age) else stale).append(report)
    return record_heartbeats(fresh_reports, stale=stale)
