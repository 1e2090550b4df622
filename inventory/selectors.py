"""Reads of the inventory app: pools and their capacity, nodes, GPUs, events."""

from __future__ import annotations

from typing import Any

from django.core.cache import cache
from django.db.models import Count, Q, QuerySet

from inventory.choices import LIVE_STATES, GpuHealth, NodeState, RuntimeKind
from inventory.holds import holds_on_nodes
from inventory.models import Gpu, Node, NodeEvent, NodePool
from tenants.context import Actor
from tenants.models import Membership

UNKNOWN_AGENTS_KEY = "inventory:unknown-agents"
IN_SERVICE = [NodeState.READY, NodeState.CORDONED, NodeState.DRAINING]


def pools_visible_to(actor: Actor) -> QuerySet[NodePool]:
    """Return the pools `actor` may see: all for operators, else shared pools and its tenants' dedicated ones.

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
        tenant_ids = list(Membership.all_tenants.filter(user=actor.user).values_list("tenant_id", flat=True))
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
