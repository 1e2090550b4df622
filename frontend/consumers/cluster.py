"""`/ws/cluster/` (operators): every node's GPUs and who holds them, then once a second the utilization of
those that reported, and the holders of those that changed hands."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels.db import database_sync_to_async

from frontend.consumers.base import LiveConsumer
from frontend.heatmap import GpuHolder, live_holders
from inventory.agent.reporter import node_gpu_group
from inventory.selectors import live_cluster
from tenants.context import Actor

log = logging.getLogger(__name__)

# Seconds between two `utilization` messages: samples arriving meanwhile are coalesced into one.
FLUSH_SECONDS = 1.0
# Seconds between two reads of the holders when no placement is announced: releases are not announced
# on the nodes' groups, so this bounds how long a released GPU still shows its former holder.
HOLDERS_REFRESH_SECONDS = 10.0


class ClusterConsumer(LiveConsumer):
    """Joins every node's sample group and coalesces what arrives into one message per second; sends the
    holders of the GPUs at start, after a placement on a watched node, and every HOLDERS_REFRESH_SECONDS,
    each time only the nodes and workloads that changed."""

    operators_only = True
    nodes: list[dict[str, Any]]
    # GPU UUID -> (node name, position in that node's GPU list)
    where: dict[str, tuple[str, int]]
    widths: dict[str, int]
    pending: dict[str, list[float | None]]
    # What the client was last told: workload id per GPU position by node, and each workload as sent.
    held: dict[str, list[int | None]]
    told: dict[int, dict[str, Any]]
    holders_due: bool
    holders_read_at: float

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
        self.held, self.told = {}, {}
        self.holders_due = False
        for node in self.nodes:
            await self.join(node_gpu_group(node["name"]))
        await self.emit({"type": "cluster", "nodes": self.nodes})
        await self._send_holders(everything=True)
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
        """GPUs of a watched node changed hands: the next flush sends their holders."""
        self.holders_due = True

    async def _flush_every_second(self) -> None:
        while not self._closed:
            await asyncio.sleep(FLUSH_SECONDS)
            if self.pending:
                pending, self.pending = self.pending, {}
                await self.emit({"type": "utilization", "at": time.time(), "nodes": pending})
            if self.holders_due or time.monotonic() - self.holders_read_at >= HOLDERS_REFRESH_SECONDS:
                try:
                    await self._send_holders()
                except Exception:
                    log.exception("cluster holders could not be read; trying again next period")

    async def _send_holders(self, *, everything: bool = False) -> None:
        """Read the holders and send those of nodes (and the workloads) that changed since last sent;
        with `everything`, every node's, so the client drops whatever the page showed before."""
        self.holders_due = False
        self.holders_read_at = time.monotonic()
        by_uuid, workloads = await database_sync_to_async(live_holders)()
        nodes = self._changed_nodes(by_uuid, everything)
        named = {pk for row in nodes.values() for pk in row if pk is not None}
        changed = {pk for pk, holder in workloads.items() if self.told.get(pk) != holder.as_json()}
        sent = _as_json(workloads, named | (changed & set(by_uuid.values())))
        if nodes or sent:
            self.told.update({int(pk): workload for pk, workload in sent.items()})
            await self.emit({"type": "holders", "workloads": sent, "nodes": nodes})

    def _changed_nodes(self, by_uuid: dict[str, int], everything: bool) -> dict[str, list[int | None]]:
        changed = {}
        for node in self.nodes:
            row = [by_uuid.get(gpu["uuid"]) for gpu in node["gpus"]]
            if everything or self.held.get(node["name"], [None] * len(row)) != row:
                changed[node["name"]] = self.held[node["name"]] = row
        return changed


def _as_json(workloads: dict[int, GpuHolder], ids: set[int]) -> dict[str, dict[str, Any]]:
    return {str(pk): workloads[pk].as_json() for pk in sorted(ids)}
