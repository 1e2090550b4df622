"""GPU samples live: `/ws/workloads/<id>/metrics/` (the workload's GPUs) and `/ws/nodes/<name>/metrics/` (operators).

Agents publish each node's samples once a second to `gpus.node.<name>`;
these consumers join the groups of the nodes they show and forward the
samples slimmed to the protocol's fields. A workload's stream forwards
only the GPUs it holds right now: it re-reads its allocations whenever the
workload changes state or releases GPUs, and whenever a pass hands GPUs of
one of its nodes to some workload, so a GPU that changed hands is not shown
to its former holder.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from channels.db import database_sync_to_async
from django.utils import timezone

from frontend.consumers.base import LiveConsumer
from frontend.consumers.workloads import WorkloadStream
from inventory.agent.reporter import node_gpu_group
from inventory.selectors import live_node, live_node_history
from jobs.live import workload_group
from jobs.selectors import live_workload_gpus, live_workload_history
from tenants.context import Actor

# The per-minute history a chart starts with.
HISTORY = timedelta(hours=1)
SAMPLE_FIELDS = ("uuid", "index", "utilization_gpu", "memory_used_mib", "memory_total_mib", "power_w", "temperature_c")


def slim(sample: dict[str, Any]) -> dict[str, Any]:
    """Return the protocol's fields of one GPU sample (None where the agent reported nothing)."""
    return {name: sample.get(name) for name in SAMPLE_FIELDS}


def gpus_message(node: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the `gpus` message for some samples of `node` (slimmed), stamped with their newest sampling time."""
    stamps = [sample["timestamp"] for sample in samples if isinstance(sample.get("timestamp"), int | float)]
    at = max(stamps) if stamps else time.time()
    return {"type": "gpus", "node": node, "at": at, "gpus": [slim(sample) for sample in samples]}


class WorkloadMetricsConsumer(WorkloadStream):
    """The samples of the GPUs a workload holds, and its allocations whenever they change."""

    gpus: list[dict[str, Any]] | None = None
    node_of: dict[str, str]

    def parse(self, route: dict[str, Any], params: dict[str, str]) -> None:
        super().parse(route, params)
        self.node_of = {}

    async def start(self) -> None:
        await self.join(workload_group(self.workload_id))
        await self.refresh_allocations()
        since = timezone.now() - HISTORY
        history = await database_sync_to_async(live_workload_history)(self.workload, since=since)
        if history:
            await self.emit({"type": "history", "gpus": history})

    async def refresh_allocations(self) -> None:
        """Re-read the GPUs held, follow their nodes' groups, and send `allocations` when they changed."""
        gpus = await database_sync_to_async(live_workload_gpus)(self.workload)
        self.node_of = {gpu["uuid"]: gpu["node"] for gpu in gpus}
        wanted = {node_gpu_group(node) for node in self.node_of.values()}
        for group in [group for group in self._joined if group.startswith("gpus.node.") and group not in wanted]:
            await self.leave(group)
        for group in sorted(wanted - self._joined):
            await self.join(group)
        if gpus != self.gpus:
            self.gpus = gpus
            await self.emit({"type": "allocations", "gpus": gpus})

    async def gpu_samples(self, event: dict[str, Any]) -> None:
        mine = [sample for sample in event["samples"] if sample.get("uuid") in self.node_of]
        if mine:
            await self.emit(gpus_message(self.node_of[mine[0]["uuid"]], mine))

    async def gpus_allocated(self, event: dict[str, Any]) -> None:
        await self.refresh_allocations()

    async def workload_changed(self, event: dict[str, Any]) -> None:
        await self.refresh_allocations()

    async def workload_allocations(self, event: dict[str, Any]) -> None:
        await self.refresh_allocations()


class NodeMetricsConsumer(LiveConsumer):
    """Every GPU sample of one node, for operators."""

    operators_only = True
    name: str
    node: dict[str, Any]

    def parse(self, route: dict[str, Any], params: dict[str, str]) -> None:
        self.name = str(route["name"])

    def authorize(self, actor: Actor) -> bool:
        node = live_node(self.name)
        if node is not None:
            self.node = node
        return node is not None

    async def start(self) -> None:
        await self.join(node_gpu_group(self.name))
        await self.emit({"type": "node", **self.node})
        history = await database_sync_to_async(live_node_history)(self.name, since=timezone.now() - HISTORY)
        if history:
            await self.emit({"type": "history", "gpus": history})

    async def gpu_samples(self, event: dict[str, Any]) -> None:
        await self.emit(gpus_message(self.name, event["samples"]))

    async def gpus_allocated(self, event: dict[str, Any]) -> None:
        """Who holds a GPU does not change what an operator sees of the node."""
