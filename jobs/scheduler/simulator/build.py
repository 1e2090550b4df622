"""Turning a trace into what the core reads: nodes, default quotas and pending workloads."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from jobs.scheduler.core import Gpu, Node, ProjectQuota, TenantQuota, Workload
from jobs.scheduler.simulator.traces import DEFAULT_POOL, TraceJob, TraceNode

POOL = DEFAULT_POOL


def core_nodes(nodes: Iterable[TraceNode]) -> tuple[Node, ...]:
    """Return the trace's nodes as the core's, each in its pool, every GPU healthy and free."""
    return tuple(
        Node(
            name=n.name,
            pool=n.pool,
            cpu_milli=n.cpu_milli,
            memory_mib=n.memory_mib,
            cpu_free_milli=n.cpu_milli,
            memory_free_mib=n.memory_mib,
            gpus=tuple(Gpu(f"{n.name}/{i}", i, n.model) for i in range(n.gpus)),
        )
        for n in nodes
    )


def gpu_hour_shares(jobs: Sequence[TraceJob]) -> dict[str, float]:
    """Return each tenant's share of the submitted GPU-hours (CPU-only jobs count as nothing); they sum to 1."""
    hours: dict[str, float] = defaultdict(float)
    for job in jobs:
        hours[job.tenant] += job.total_gpus * job.duration_s
    total = sum(hours.values())
    tenants = sorted({job.tenant for job in jobs})
    return {t: hours[t] / total if total else 1 / len(tenants) for t in tenants}


def default_quotas(
    shares: dict[str, float], capacity: int, pool: str = POOL
) -> tuple[tuple[TenantQuota, ...], tuple[ProjectQuota, ...]]:
    """Return guarantees proportional to `shares` summing to `capacity` (largest remainders), limit = capacity.

    Every tenant has one project of the same name holding the tenant's quota.
    Weights equal the guarantees (at least 1), so idle capacity is shared in
    the same proportions.
    """
    exact = {t: share * capacity for t, share in shares.items()}
    guaranteed = {t: int(v) for t, v in exact.items()}
    for tenant in sorted(exact, key=lambda t: (guaranteed[t] - exact[t], t))[: capacity - sum(guaranteed.values())]:
        guaranteed[tenant] += 1
    tenants = tuple(
        TenantQuota(t, pool, guaranteed[t], capacity, float(max(1, guaranteed[t]))) for t in sorted(guaranteed)
    )
    projects = tuple(ProjectQuota(q.tenant, q.tenant, pool, q.guaranteed, q.limit, 1.0) for q in tenants)
    return tenants, projects


def pending_workload(job: TraceJob, limit_s: float | None = None, predicted_s: float | None = None) -> Workload:
    """Return a trace job as a pending workload of its project, with the limit it was submitted with and the
    run time predicted for it: what a policy may know of its duration (never the true run time)."""
    return Workload(
        id=job.id,
        tenant=job.tenant,
        project=job.project_name,
        pool=job.pool,
        submitted_at=job.submitted_at,
        gpus=job.gpus,
        replicas=job.replicas,
        models=job.models,
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
        limit_s=limit_s,
        predicted_s=predicted_s,
    )
