"""`/ws/cluster/` (operators): every node's GPUs, then once a second the utilization of those that reported."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from frontend.consumers.base import LiveConsumer
from inventory.agent.reporter import node_gpu_group
from inventory.selectors import live_cluster
from tenants.context import Actor

# Seconds between two `utilization` messages: samples arriving meanwhile are coalesced into one.
FLUSH_SECONDS = 1.0


class ClusterConsumer(LiveConsumer):
    """Joins every node's sample group and coalesces what arrives into one message per second."""

    operators_only = True
    nodes: list[dict[str, Any]]
    # GPU UUID -> (node name, position in that node's GPU list)
    where: dict[str, tuple[str, int]]
    widths: dict[str, int]
    pending: dict[str, list[float | None]]

    def authorize(self, actor: Actor) -> bool:
        self.nodes = live_cluster()  # operators only: the base has checked that
        return True

    async def start(self) -> None:
        # Samples are a stream of latest values, nothing to deduplicate: the layout read at authorization
        # serves, and the groups are joined after it.
        self.where = {
            gpu["uuid"]: (node["name"], position) for node in self.nodes for position, gpu in enumerate(node["gpus"])
        }
        self.widths = {node["name"]: len(node["gpus"]) for node in self.nodes}
        self.pending = {}
        for node in self.nodes:
            await self.join(node_gpu_group(node["name"]))
        await self.emit({"type": "cluster", "nodes": self.nodes})
        self._tasks.append(asyncio.create_task(self._flush_every_second()))

    async def gpu_samples(self, event: dict[str, Any]) -> None:
        for sample in event["samples"]:
            place = self.where.get(str(sample.get("uuid")))
            if place is None:
                continue
            node, position = place
            row = self.pending.get(node)
            if row is None:
                row = self.pending[node] = [None] * self.widths[node]
            row[position] = sample.get("utilization_gpu")

    async def gpus_allocated(self, event: dict[str, Any]) -> None:
        """Who holds a GPU does not change the heatmap."""

    async def _flush_every_second(self) -> None:
        while not self._closed:
            await asyncio.sleep(FLUSH_SECONDS)
            if self.pending:
                pending, self.pending = self.pending, {}
                await self.emit({"type": "utilization", "at": time.time(), "nodes": pending})
