"""Small builders for declarative cluster layouts: nodes, quotas and workloads in one line each."""

from __future__ import annotations

from jobs.scheduler.core import (
    Gpu,
    Node,
    PlacementPolicy,
    Pool,
    ProjectQuota,
    ReplicaAllocation,
    SchedulerConfig,
    Snapshot,
    TenantQuota,
    Workload,
    WorkloadKind,
)


def node(
    name: str,
    *,
    pool: str = "p",
    gpus: int = 8,
    used: int = 0,
    model: str = "A100",
    failed: tuple[int, ...] = (),
    schedulable: bool = True,
    cpu: int = 64_000,
    memory: int = 256_000,
) -> Node:
    """Return a node whose first `used` GPUs are allocated and whose `failed` GPU indexes are unhealthy."""
    return Node(
        name=name,
        pool=pool,
        cpu_milli=cpu,
        memory_mib=memory,
        cpu_free_milli=cpu,
        memory_free_mib=memory,
        gpus=tuple(Gpu(f"{name}-gpu{i}", i, model, healthy=i not in failed, free=i >= used) for i in range(gpus)),
        schedulable=schedulable,
    )


def job(
    id: str,
    tenant: str = "a",
    *,
    project: str | None = None,
    pool: str = "p",
    gpus: int = 1,
    replicas: int = 1,
    priority: int = 0,
    at: float = 0.0,
    models: tuple[str, ...] = (),
    kind: WorkloadKind = WorkloadKind.JOB,
    cpu: int = 0,
    memory: int = 0,
) -> Workload:
    """Return a pending workload; the project defaults to the tenant's name."""
    return Workload(
        id=id,
        tenant=tenant,
        project=project or tenant,
        pool=pool,
        submitted_at=at,
        gpus=gpus,
        replicas=replicas,
        kind=kind,
        priority=priority,
        models=frozenset(models),
        cpu_milli=cpu,
        memory_mib=memory,
    )


def running(workload: Workload, *replicas: tuple[str, tuple[int, ...]], started: float = 0.0) -> Workload:
    """Return `workload` running since `started` on (node, GPU indexes) per replica."""
    allocation = tuple(ReplicaAllocation(n, tuple(f"{n}-gpu{i}" for i in idx)) for n, idx in replicas)
    return Workload(
        **{f: getattr(workload, f) for f in Workload.__slots__ if f not in ("started_at", "allocation")},
        started_at=started,
        allocation=allocation,
    )


def quota(tenant: str, guaranteed: int, limit: int, *, pool: str = "p", weight: float = 1.0) -> TenantQuota:
    """Return a tenant quota in a pool."""
    return TenantQuota(tenant, pool, guaranteed, limit, weight)


def project_quota(
    project: str, tenant: str, guaranteed: int, limit: int, *, pool: str = "p", weight: float = 1.0
) -> ProjectQuota:
    """Return a project quota in a pool."""
    return ProjectQuota(project, tenant, pool, guaranteed, limit, weight)


def snapshot(
    nodes: list[Node],
    quotas: list[TenantQuota],
    pending: list[Workload],
    *,
    running_now: list[Workload] | None = None,
    projects: list[ProjectQuota] | None = None,
    pools: list[Pool] | None = None,
    now: float = 10_000.0,
    config: SchedulerConfig | None = None,
) -> Snapshot:
    """Return a snapshot; pools default to one binpack pool per pool name the nodes use."""
    names = sorted({n.pool for n in nodes})
    return Snapshot(
        now=now,
        pools=tuple(pools or [Pool(name, PlacementPolicy.BINPACK) for name in names]),
        nodes=tuple(nodes),
        tenant_quotas=tuple(quotas),
        project_quotas=tuple(projects or ()),
        running=tuple(running_now or ()),
        pending=tuple(pending),
        config=config or SchedulerConfig(),
    )
