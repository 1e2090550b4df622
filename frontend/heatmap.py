"""The operators' picture of the fleet: who holds each GPU, the cluster heatmap, the figures at a glance.

Operators only: these reads cross tenants (through the `all_tenants`
managers) and name every tenant's projects and workloads, so nothing here
may serve a tenant's page.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import groupby
from typing import Any

from django.conf import settings
from django.db.models import Case, FloatField, Q, When
from django.utils import timezone

from inventory.choices import NodeState, RuntimeKind
from inventory.models import Gpu, Node
from jobs.choices import WorkloadState
from jobs.models import Allocation

# A GPU held by a running workload and busy below this (percent) counts as "allocated but idle".
IDLE_BELOW = 5.0


@dataclass(frozen=True)
class GpuHolder:
    """The workload holding a GPU, named as an operator reads it: tenant / project / workload."""

    workload_id: int
    name: str
    tenant: str
    project: str
    owner: str
    state: str

    @property
    def label(self) -> str:
        return f"{self.tenant} / {self.project} / {self.name}"

    @property
    def running(self) -> bool:
        return self.state == WorkloadState.RUNNING

    def as_json(self) -> dict[str, Any]:
        """Return what cluster.js knows of a holder (the `holders` message and the page's JSON)."""
        return {
            "tenant": self.tenant,
            "project": self.project,
            "name": self.name,
            "owner": self.owner,
            "state": self.state,
        }


_HOLDER_FIELDS = (
    "workload_id",
    "workload__name",
    "workload__tenant__slug",
    "workload__project__slug",
    "workload__owner__username",
    "workload__state",
)


def _holders_by(key: str, gpus: Q | None) -> dict[Any, GpuHolder]:
    """Return {`key` of the GPU: holder} over the active GPU allocations matching `gpus`; one query,
    one `GpuHolder` per workload."""
    rows = Allocation.all_tenants.filter(released_at__isnull=True, gpu__isnull=False)
    if gpus is not None:
        rows = rows.filter(gpus)
    holders: dict[int, GpuHolder] = {}
    by_gpu: dict[Any, GpuHolder] = {}
    for gpu, workload_id, *rest in rows.order_by().values_list(key, *_HOLDER_FIELDS):
        holder = holders.get(workload_id)
        if holder is None:
            holder = holders[workload_id] = GpuHolder(workload_id, *rest)
        by_gpu[gpu] = holder
    return by_gpu


def gpu_holders(gpus: Q | None = None) -> dict[int, GpuHolder]:
    """Return {GPU id: holder} for the GPUs an active allocation holds, narrowed by `gpus` (a filter on
    allocations, e.g. `Q(gpu__node=node)`); one query."""
    return _holders_by("gpu_id", gpus)


def is_idle(holder: GpuHolder | None, utilization: float | None) -> bool:
    """Return whether a GPU is allocated but idle: its running holder uses it below IDLE_BELOW percent.

    A GPU without a recent sample is not called idle (nothing is known), nor
    one whose workload is still starting (it has not begun to use it).
    """
    return holder is not None and holder.running and utilization is not None and utilization < IDLE_BELOW


@dataclass(frozen=True)
class HeatmapGpu:
    """One cell of the cluster heatmap: `utilization` is None when the GPU has no recent sample."""

    uuid: str
    index: int
    model: str
    utilization: float | None
    holder: GpuHolder | None = None

    @property
    def idle(self) -> bool:
        return is_idle(self.holder, self.utilization)


@dataclass(frozen=True)
class HeatmapNode:
    name: str
    state: str
    state_label: str
    gpus: list[HeatmapGpu]
    simulated: bool = False


@dataclass(frozen=True)
class HeatmapPool:
    name: str
    nodes: list[HeatmapNode]

    @property
    def simulated(self) -> int:
        return sum(node.simulated for node in self.nodes)


@dataclass(frozen=True)
class Heatmap:
    """The heatmap's pools (by name, nodes by name), the workloads holding its GPUs, and its totals."""

    pools: list[HeatmapPool]
    holders: dict[int, GpuHolder]

    def gpus(self) -> list[HeatmapGpu]:
        return [gpu for pool in self.pools for node in pool.nodes for gpu in node.gpus]

    def totals(self) -> dict[str, Any]:
        """Return {gpus, held, idle, average}: the figures above the map (average utilization of sampled GPUs)."""
        gpus = self.gpus()
        sampled = [gpu.utilization for gpu in gpus if gpu.utilization is not None]
        return {
            "gpus": len(gpus),
            "held": sum(gpu.holder is not None for gpu in gpus),
            "idle": sum(gpu.idle for gpu in gpus),
            "average": round(sum(sampled) / len(sampled)) if sampled else None,
        }

    def holders_json(self) -> dict[str, dict[str, Any]]:
        return {str(pk): holder.as_json() for pk, holder in self.holders.items()}


def _fresh_after(now: datetime | None) -> datetime:
    """Return the time a sample must be newer than to count: older than the heartbeat timeout, the
    node stopped reporting and an old figure would read as current."""
    return (now or timezone.now()) - timedelta(seconds=settings.NODE_HEARTBEAT_TIMEOUT_SECONDS)


def _fresh_utilization(now: datetime | None) -> Case:
    """Return the SQL expression of a GPU's utilization, NULL when its latest sample is not fresh.
    Decided in SQL: parsing 8,000 timestamps in Python costs more than the query."""
    fresh = When(last_sample_at__gte=_fresh_after(now), then="utilization")
    return Case(fresh, default=None, output_field=FloatField())


def cluster_heatmap(*, now: datetime | None = None) -> Heatmap:
    """Return every node that is not retired with its present GPUs and their holders, by pool name then
    node name; three queries whatever the fleet's size."""
    nodes = Node.objects.exclude(state=NodeState.RETIRED).order_by("pool__name", "name")
    rows = nodes.values_list("id", "name", "state", "runtime", "pool__name")
    holders = gpu_holders(~Q(gpu__node__state=NodeState.RETIRED))
    gpus: dict[int, list[HeatmapGpu]] = defaultdict(list)
    samples = (
        Gpu.objects.filter(present=True)
        .exclude(node__state=NodeState.RETIRED)
        .order_by("node_id", "index")
        .values_list("id", "node_id", "uuid", "index", "model", _fresh_utilization(now))
    )
    for gpu_id, node_id, uuid, index, model, utilization in samples:
        gpus[node_id].append(HeatmapGpu(uuid, index, model, utilization, holders.get(gpu_id)))
    pools = [
        HeatmapPool(
            pool,
            [
                HeatmapNode(name, state, NodeState(state).label, gpus[node_id], runtime == RuntimeKind.SIMULATED)
                for node_id, name, state, runtime, _ in members
            ],
        )
        for pool, members in groupby(rows, key=lambda row: row[4])
    ]
    return Heatmap(pools, {holder.workload_id: holder for holder in holders.values()})


def live_holders() -> tuple[dict[str, int], dict[int, GpuHolder]]:
    """Return ({GPU UUID: workload id}, {workload id: holder}) for every GPU an active allocation holds,
    for the live heatmap; one query."""
    by_uuid: dict[str, GpuHolder] = _holders_by("gpu__uuid", None)
    return (
        {uuid: holder.workload_id for uuid, holder in by_uuid.items()},
        {holder.workload_id: holder for holder in by_uuid.values()},
    )


@dataclass(frozen=True)
class FleetGlance:
    """The fleet's GPUs in three figures: present (on nodes not retired), allocated, allocated but idle."""

    gpus: int
    held: int
    idle: int


def fleet_glance(*, now: datetime | None = None) -> FleetGlance:
    """Return the fleet's GPU, allocated and allocated-but-idle counts (as `is_idle` decides); three queries."""
    held = Allocation.all_tenants.filter(released_at__isnull=True, gpu__isnull=False)
    idle = held.filter(
        workload__state=WorkloadState.RUNNING,
        gpu__last_sample_at__gte=_fresh_after(now),
        gpu__utilization__lt=IDLE_BELOW,
    )
    gpus = Gpu.objects.filter(present=True).exclude(node__state=NodeState.RETIRED)
    return FleetGlance(gpus=gpus.count(), held=held.count(), idle=idle.count())


@dataclass(frozen=True)
class NodeGpuRow:
    """A row of a node's GPU table: the GPU, the workload holding it, and whether it idles while held."""

    gpu: Gpu
    holder: GpuHolder | None
    idle: bool


def node_gpu_rows(node: Node, *, now: datetime | None = None) -> list[NodeGpuRow]:
    """Return `node`'s present GPUs by index with their holders; two queries. A utilization older than
    the heartbeat timeout does not make a GPU idle (see `is_idle`)."""
    gpus = Gpu.objects.filter(node=node, present=True).order_by("index")
    holders = gpu_holders(Q(gpu__node=node))
    fresh_after = _fresh_after(now)
    rows = []
    for gpu in gpus:
        fresh = gpu.last_sample_at is not None and gpu.last_sample_at >= fresh_after
        holder = holders.get(gpu.pk)
        rows.append(NodeGpuRow(gpu, holder, is_idle(holder, gpu.utilization if fresh else None)))
    return rows
