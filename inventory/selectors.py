"""Reads of the inventory app: pools and their capacity, nodes, GPUs, events, per-minute GPU rollups, storage use."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.core.cache import cache
from django.db.models import Count, Q, QuerySet, Sum

from inventory.choices import LIVE_STATES, GpuHealth, NodeState, RuntimeKind
from inventory.holds import holds_on_nodes
from inventory.models import Gpu, GpuMinute, Node, NodeEvent, NodePool, Volume
from tenants.context import Actor
from tenants.models import Membership

UNKNOWN_AGENTS_KEY = "inventory:unknown-agents"
IN_SERVICE = [NodeState.READY, NodeState.CORDONED, NodeState.DRAINING]


def pools_visible_to(actor: Actor) -> QuerySet[NodePool]:
    """Return the pools `actor` may see: all for operators, else shared pools and its active tenants' dedicated ones.

    A token narrows this to the pools its own tenant may use.
    """
    pools = NodePool.objects.select_related("dedicated_tenant")
    if actor.is_operator:
        return pools
    if actor.user is None:
        return pools.none()
    if actor.token is not None:
        tenant_ids: list[int | None] = [actor.token.tenant_id]
    else:
        memberships = Membership.all_tenants.filter(user=actor.user, tenant__is_active=True)
        tenant_ids = list(memberships.values_list("tenant_id", flat=True))
    return pools.filter(Q(dedicated_tenant__isnull=True) | Q(dedicated_tenant_id__in=tenant_ids))


def pools_open_to_tenant(tenant_id: int) -> QuerySet[NodePool]:
    """Return the pools a tenant may hold quota in: shared ones and those dedicated to it."""
    return NodePool.objects.filter(Q(dedicated_tenant__isnull=True) | Q(dedicated_tenant_id=tenant_id))


def nodes_for_operators() -> QuerySet[Node]:
    """Return every node with its pool and GPU counts (`gpu_count`, `failed_gpu_count`) annotated."""
    present = Q(gpus__present=True)
    return (
        Node.objects.select_related("pool")
        .annotate(
            gpu_count=Count("gpus", filter=present),
            failed_gpu_count=Count("gpus", filter=present & Q(gpus__health=GpuHealth.FAILED)),
        )
        .order_by("name")
    )  # Meta.ordering does not apply to aggregating queries


def gpus_for_operators() -> QuerySet[Gpu]:
    """Return every present GPU with its node and pool."""
    return Gpu.objects.filter(present=True).select_related("node", "node__pool")


def node_events(node: Node) -> QuerySet[NodeEvent]:
    """Return `node`'s events, newest first."""
    return NodeEvent.objects.filter(node=node).select_related("gpu")


def schedulable_gpus() -> QuerySet[Gpu]:
    """Return the GPUs the scheduler may offer: present, not failed, on ready nodes.

    Cordoned, draining, unreachable and maintenance nodes offer nothing new;
    a failed GPU is never offered.
    """
    return (
        Gpu.objects.filter(present=True, node__state=NodeState.READY)
        .exclude(health=GpuHealth.FAILED)
        .select_related("node")
    )


def pool_capacity(pool_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Return {pool id: [{model, total, free}]} per GPU model, in one query plus the hold counters.

    `total` counts present GPUs on nodes in service (ready, cordoned,
    draining); `free` those the scheduler could place on now, less what is held.
    """
    rows = (
        Gpu.objects.filter(present=True, node__pool_id__in=pool_ids, node__state__in=IN_SERVICE)
        .values("node__pool_id", "node_id", "model", "health", "node__state")
        .annotate(n=Count("id"))
    )
    holds = holds_on_nodes(sorted({row["node_id"] for row in rows}))
    totals: dict[tuple[int, str], list[int]] = {}
    for row in rows:
        entry = totals.setdefault((row["node__pool_id"], row["model"]), [0, 0])
        entry[0] += row["n"]
        if row["node__state"] == NodeState.READY and row["health"] != GpuHealth.FAILED:
            entry[1] += row["n"]
    for node_id, held in holds.items():
        for row in rows:
            if row["node_id"] == node_id:
                entry = totals[(row["node__pool_id"], row["model"])]
                entry[1] = max(0, entry[1] - held)
                break
    result: dict[int, list[dict[str, Any]]] = {pool_id: [] for pool_id in pool_ids}
    for (pool_id, model), (total, free) in sorted(totals.items()):
        result[pool_id].append({"model": model, "total": total, "free": free})
    return result


def simulated_nodes_to_heartbeat() -> list[tuple[str, int, str]]:
    """Return (name, GPU count, model) of simulated nodes that would heartbeat if they had an agent."""
    states = [*LIVE_STATES, NodeState.UNREACHABLE]
    rows = Node.objects.filter(runtime=RuntimeKind.SIMULATED, state__in=states)
    return list(rows.values_list("name", "simulated_gpu_count", "simulated_gpu_model"))


def unknown_agents() -> dict[str, str]:
    """Return {node name: last seen} of agents reporting for nodes nobody registered (the recent ones)."""
    return dict(cache.get(UNKNOWN_AGENTS_KEY) or {})


# --- per-minute GPU rollups -------------------------------------------------------------

MinuteRow = tuple[int, float, float, int | None]
"""One rollup minute as charts read it: (start of the minute in seconds since the epoch, average
utilization, maximum utilization, maximum memory used in MB or None)."""


def minute_start(at: datetime) -> datetime:
    """Return the start of the UTC minute holding `at`."""
    return at.astimezone(UTC).replace(second=0, microsecond=0)


def _minute_rows(rows: Iterable[tuple[Any, datetime, int, float, float, int | None]]) -> dict[Any, list[MinuteRow]]:
    """Group (key, minute, samples, utilization sum, utilization max, memory max) rows by key, each minute once."""
    grouped: dict[Any, dict[int, MinuteRow]] = {}
    for key, minute, samples, utilization_sum, utilization_max, memory in rows:
        at = int(minute.timestamp())
        grouped.setdefault(key, {})[at] = (at, round(utilization_sum / samples, 2), utilization_max, memory)
    return {key: sorted(minutes.values()) for key, minutes in grouped.items()}


_ROW_FIELDS = ("minute", "samples", "utilization_sum", "utilization_max", "memory_used_max_mib")


def gpu_minutes_in(windows: Iterable[tuple[int, datetime, datetime | None]]) -> dict[int, list[MinuteRow]]:
    """Return {GPU id: rollup minutes, oldest first} of the minutes overlapping each (GPU id, start, end) window.

    A minute overlaps a window when it ends after `start` and begins before
    `end` (None: no end), so a minute in which a GPU changed hands belongs
    to both holders' windows. One query.
    """
    condition = Q()
    for gpu_id, start, end in windows:
        window = Q(gpu_id=gpu_id, minute__gte=minute_start(start))
        if end is not None:
            window &= Q(minute__lt=end)
        condition |= window
    if not condition:
        return {}
    rows = GpuMinute.objects.filter(condition).order_by("gpu_id", "minute").values_list("gpu_id", *_ROW_FIELDS)
    return _minute_rows(rows)


def node_gpu_minutes(node: Node, *, since: datetime) -> dict[str, list[MinuteRow]]:
    """Return {GPU UUID: rollup minutes since `since`, oldest first} for the present GPUs of `node`. One query."""
    rows = (
        GpuMinute.objects.filter(gpu__node=node, gpu__present=True, minute__gte=minute_start(since))
        .order_by("gpu_id", "minute")
        .values_list("gpu__uuid", *_ROW_FIELDS)
    )
    return _minute_rows(rows)


# --- live streams -----------------------------------------------------------------------


def live_node(name: str) -> dict[str, Any] | None:
    """Return {name, pool, gpus: [{uuid, index, model}]} of node `name` (present GPUs by index), or None."""
    node = Node.objects.select_related("pool").filter(name=name).first()
    if node is None:
        return None
    gpus = node.gpus.filter(present=True).order_by("index").values("uuid", "index", "model")
    return {"name": node.name, "pool": node.pool.name, "gpus": list(gpus)}


def live_node_history(name: str, *, since: datetime) -> dict[str, list[MinuteRow]]:
    """Return the per-minute rollups of node `name`'s present GPUs since `since`, or {} for no such node."""
    node = Node.objects.filter(name=name).first()
    return node_gpu_minutes(node, since=since) if node is not None else {}


def live_cluster() -> list[dict[str, Any]]:
    """Return every node not retired as {name, pool, state, simulated, gpus: [{uuid, index, model}]}, by pool
    then name.

    Two queries whatever the cluster's size.
    """
    nodes = list(
        Node.objects.exclude(state=NodeState.RETIRED)
        .order_by("pool__name", "name")
        .values("id", "name", "pool__name", "state", "runtime")
    )
    gpus: dict[int, list[dict[str, Any]]] = {node["id"]: [] for node in nodes}
    rows = Gpu.objects.filter(node_id__in=list(gpus), present=True).order_by("node_id", "index")
    for node_id, uuid, index, model in rows.values_list("node_id", "uuid", "index", "model"):
        gpus[node_id].append({"uuid": uuid, "index": index, "model": model})
    return [
        {
            "name": node["name"],
            "pool": node["pool__name"],
            "state": node["state"],
            "simulated": node["runtime"] == RuntimeKind.SIMULATED,
            "gpus": gpus[node["id"]],
        }
        for node in nodes
    ]


@dataclass(frozen=True)
class StorageUse:
    """The bytes a tenant's volumes hold as last measured (`Volume.used_bytes`): in all, and by project id."""

    total: int
    by_project: dict[int, int]

    def of_project(self, project_id: int) -> int:
        """Return the bytes the volumes of project `project_id` hold (0 when it has none)."""
        return self.by_project.get(project_id, 0)


def storage_use(tenant_id: int) -> StorageUse:
    """Return what tenant `tenant_id`'s volumes use, in all (homes and datasets included) and per project; one
    query. What the storage page shows and what the upload quotas judge (`volume_files.room`)."""
    rows = (
        Volume.all_tenants.filter(tenant_id=tenant_id)
        .values_list("project_id")
        .annotate(used=Sum("used_bytes"))
        .order_by()
    )
    by_project = {project: int(used or 0) for project, used in rows if project is not None}
    return StorageUse(total=sum(int(used or 0) for _, used in rows), by_project=by_project)
