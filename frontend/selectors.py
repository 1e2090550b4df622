"""Reads the pages need beyond the apps' own selectors."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Case, Count, Exists, IntegerField, OuterRef, Prefetch, Q, QuerySet, Value, When
from django.utils.dateparse import parse_datetime

from frontend.heatmap import FleetGlance, fleet_glance
from inventory.choices import GpuHealth, NodeState, RuntimeKind
from inventory.models import Gpu, Node, NodeEvent, NodePool
from inventory.selectors import gpus_for_operators, node_events, nodes_for_operators, pool_capacity, unknown_agents
from jobs import selectors as job_selectors
from jobs.choices import ACTIVE_STATES, WorkloadState
from jobs.models import Allocation, Workload, WorkloadEvent
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import ApiToken, Membership, Tenant, TenantQuota
from tenants.selectors import memberships_of_user, own_tokens_within_reach, tenant_summaries

# How many of a node's events its page shows, newest first.
NODE_EVENTS_SHOWN = 100


def tenants_for_switcher(actor: Actor) -> list[Tenant]:
    """Return the tenants the navigation offers: every tenant for operators, else the viewer's own."""
    if actor.user is None:
        return []
    if actor.is_operator:
        return list(Tenant.objects.order_by("slug")[:200])
    return [m.tenant for m in memberships_of_user(actor.user)]


def tokens_in_scope_of_user(actor: Actor) -> QuerySet[ApiToken]:
    """Return the viewer's own tokens in the tenant in scope, as far as the token rule lets it reach them
    (`tenants.selectors.own_tokens_within_reach`)."""
    return ApiToken.objects.filter(pk__in=own_tokens_within_reach(actor).values("pk")).select_related("user")


def tenants_with_counts() -> QuerySet[Tenant]:
    """Return every tenant with its project and member counts, for the operators' list."""
    return tenant_summaries().order_by("slug")


@dataclass(frozen=True)
class PoolCapacity:
    """A pool with its GPUs in service per model: [{model, total, free}]."""

    pool: NodePool
    models: list[dict[str, Any]]


def pools_with_capacity(pools: QuerySet[NodePool]) -> list[PoolCapacity]:
    """Return `pools` (annotated with `node_count`, retired nodes left out) and their capacity, in two queries."""
    counted = list(pools.annotate(node_count=Count("nodes", filter=~Q(nodes__state=NodeState.RETIRED))))
    capacity = pool_capacity([pool.pk for pool in counted])
    return [PoolCapacity(pool=pool, models=capacity[pool.pk]) for pool in counted]


def pools_for_tenant(pools: QuerySet[NodePool], tenant: Tenant) -> QuerySet[NodePool]:
    """Return those of `pools` that `tenant` may use: shared ones and those dedicated to it."""
    return pools.filter(Q(dedicated_tenant__isnull=True) | Q(dedicated_tenant=tenant))


def capacity_for_tenant(pools: QuerySet[NodePool], tenant: Tenant) -> list[PoolCapacity]:
    """Return the capacity per GPU model of the pools among `pools` that `tenant` may use; no node details."""
    usable = list(pools_for_tenant(pools, tenant))
    capacity = pool_capacity([pool.pk for pool in usable])
    return [PoolCapacity(pool=pool, models=capacity[pool.pk]) for pool in usable]


def nodes_matching(*, pool: str = "", state: str = "") -> QuerySet[Node]:
    """Return the operators' node list (GPU counts annotated), narrowed to a pool name and a state when given."""
    nodes = nodes_for_operators()
    if pool:
        nodes = nodes.filter(pool__name=pool)
    if state:
        nodes = nodes.filter(state=state)
    return nodes


# Failed GPUs first, then degraded, then healthy ones.
WORST_FIRST = Case(
    When(health=GpuHealth.FAILED, then=Value(0)),
    When(health=GpuHealth.DEGRADED, then=Value(1)),
    default=Value(2),
    output_field=IntegerField(),
)


def gpus_worst_first(*, health: str = "", pool: str = "") -> QuerySet[Gpu]:
    """Return every present GPU with its node and pool, failed first, then degraded; narrowed when asked."""
    gpus = gpus_for_operators()
    if health:
        gpus = gpus.filter(health=health)
    if pool:
        gpus = gpus.filter(node__pool__name=pool)
    return gpus.annotate(health_rank=WORST_FIRST).order_by("health_rank", "node__name", "index")


def recent_node_events(node: Node) -> list[NodeEvent]:
    """Return `node`'s latest events, newest first."""
    return list(node_events(node)[:NODE_EVENTS_SHOWN])


def unregistered_agents() -> list[tuple[str, datetime | None]]:
    """Return (node name, last seen) of agents reporting for nodes nobody registered (yet), by name.

    The inventory remembers the names for a while; one registered meanwhile is left out.
    """
    heard = unknown_agents()
    if not heard:
        return []
    registered = set(Node.objects.filter(name__in=list(heard)).values_list("name", flat=True))
    return [
        (name, parse_datetime(seen) if isinstance(seen, str) else None)
        for name, seen in sorted(heard.items())
        if name not in registered
    ]


def queue_in_scope() -> tuple[list[Workload], list[Workload]]:
    """Return the tenant's (waiting, active) workloads: waiting by pool and queue position, active with GPUs.

    Three queries: waiting, active, and their allocations with node and GPU.
    """
    base = Workload.objects.select_related("project", "pool", "owner")
    waiting = list(base.filter(state=WorkloadState.PENDING).order_by("pool__name", "queue_position", "submitted_at"))
    active: list[Workload] = list(
        base.filter(state__in=ACTIVE_STATES)
        .order_by("-scheduled_at", "-id")
        .prefetch_related(
            Prefetch(
                "allocations",
                queryset=Allocation.objects.filter(released_at__isnull=True).select_related("node", "gpu"),
                to_attr="active_allocations",
            )
        )
    )
    return waiting, active


def reserved_among(waiting: list[Workload]) -> list[Workload]:
    """Return those of `waiting` that hold a reservation, soonest first."""
    return sorted((w for w in waiting if w.reserved_from is not None), key=lambda w: (w.reserved_from, w.pk))


def recent_preemptions_in_scope(*, limit: int = 20) -> list[WorkloadEvent]:
    """Return the tenant's latest preemptions, newest first, with their workloads: what each reclaim cost.

    Each event's message says how much work it threw away (GPU time since the
    victim's last checkpoint) and what restarting costs; the event keeps both
    numbers (`lost_gpu_seconds`, `overhead_gpu_seconds`; None on events
    written before they were kept), and the workload's `lost_gpu_seconds` totals the first.
    """
    return list(
        WorkloadEvent.objects.filter(to_state=WorkloadState.PREEMPTED)
        .select_related("workload__project", "workload__owner")
        .order_by("-created_at", "-id")[:limit]
    )


def workloads_matching(
    *, state: str = "", project: str = "", kind: str = "", owner: User | None = None
) -> QuerySet[Workload]:
    """Return the tenant's workloads, newest first, with project, pool and owner; narrowed to a state,
    a project slug, a kind and an owner when given. Each carries `on_simulated_node`: whether any attempt
    was placed on a simulated node (its output is made up), for the list to say so."""
    workloads = job_selectors.workloads_for_tenant(state=state or None, kind=kind or None, owner=owner)
    simulated = Allocation.objects.filter(workload=OuterRef("pk"), node__runtime=RuntimeKind.SIMULATED)
    workloads = workloads.annotate(on_simulated_node=Exists(simulated))
    return workloads.filter(project__slug=project) if project else workloads


def workload_in_scope(workload_id: int) -> Workload | None:
    """Return one of the tenant's workloads with its allocations (node, GPU) and events loaded, or None."""
    return job_selectors.workload_detail(workload_id)


@dataclass(frozen=True)
class OperatorStart:
    """How far the cloud is set up, step by step, and the fleet at a glance: an operator's start page.

    `quota_tenant` and `admin_tenant` name the tenant the quota and admin steps
    link to: the first by slug still lacking one, else the first tenant (None
    without tenants); `quotas_done` and `admins_done` say no tenant lacks one.
    """

    pools: int
    nodes: int
    ready_nodes: int
    simulated_nodes: int
    tenants: int
    quota_tenant: Tenant | None
    admin_tenant: Tenant | None
    quotas_done: bool
    admins_done: bool
    fleet: FleetGlance

    @property
    def steps_left(self) -> int:
        done = (self.pools, self.ready_nodes, self.tenants, self.quotas_done, self.admins_done)
        return sum(not step for step in done)


def operator_start() -> OperatorStart:
    """Return the operators' start page: counts of pools, nodes and tenants, which tenant lacks a quota
    or an admin, and the fleet's GPUs at a glance; a fixed number of queries."""
    nodes = Node.objects.exclude(state=NodeState.RETIRED).aggregate(
        total=Count("id"),
        ready=Count("id", filter=Q(state=NodeState.READY)),
        simulated=Count("id", filter=Q(runtime=RuntimeKind.SIMULATED)),
    )
    tenants = Tenant.objects.order_by("slug")
    first = tenants.first()
    no_quota = tenants.exclude(pk__in=TenantQuota.all_tenants.values("tenant_id")).first()
    no_admin = tenants.exclude(pk__in=Membership.all_tenants.filter(role=Role.ADMIN).values("tenant_id")).first()
    return OperatorStart(
        pools=NodePool.objects.count(),
        nodes=nodes["total"],
        ready_nodes=nodes["ready"],
        simulated_nodes=nodes["simulated"],
        tenants=tenants.count(),
        quota_tenant=no_quota or first,
        admin_tenant=no_admin or first,
        quotas_done=first is not None and no_quota is None,
        admins_done=first is not None and no_admin is None,
        fleet=fleet_glance(),
    )
