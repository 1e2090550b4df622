"""What a tenant's work holds and waits for against its quotas, now: the queue page, the API's `usage/`."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count, QuerySet

from jobs.choices import ACTIVE_STATES, WorkloadState
from jobs.models import Allocation, Workload
from tenants.models import ProjectQuota, TenantQuota


@dataclass(frozen=True)
class QuotaUse:
    """GPUs in use in one pool against a quota (a project's, or the tenant's own when `project` is None).

    `running` counts workloads placed or running there, `pending` those waiting.
    """

    project: str | None
    pool: str
    guaranteed: int
    limit: int
    in_use: int
    running: int = 0
    pending: int = 0

    @property
    def borrowed(self) -> int:
        """GPUs held above the guarantee: reclaimable when others need theirs."""
        return max(0, self.in_use - self.guaranteed)


@dataclass(frozen=True)
class TenantAllocation:
    """A tenant's GPUs in use in one pool against its quota (operators' view)."""

    tenant: str
    pool: str
    guaranteed: int
    limit: int
    in_use: int


def _gpus_held(allocations: QuerySet[Allocation], owner: str) -> dict[tuple[int, int], int]:
    """Return {(owner id, pool id): GPUs held} over the active GPU allocations of `allocations`, in one query."""
    rows = (
        allocations.filter(released_at__isnull=True, gpu__isnull=False)
        .values(owner, "workload__pool_id")
        .annotate(gpus=Count("id"))
    )
    held: dict[tuple[int, int], int] = defaultdict(int)
    for row in rows:
        held[(row[owner], row["workload__pool_id"])] += row["gpus"]
    return held


def _workload_counts(states: frozenset[str] | set[str]) -> dict[tuple[int, int], int]:
    """Return {(project id, pool id): workloads in `states`} of the tenant in scope, in one query."""
    rows = Workload.objects.filter(state__in=states).values("project_id", "pool_id").annotate(n=Count("id"))
    return {(row["project_id"], row["pool_id"]): row["n"] for row in rows}


def project_use_in_scope() -> list[QuotaUse]:
    """Return every project quota of the tenant in scope with what its project's work holds and waits for there.

    By project slug and pool name; three queries.
    """
    held = _gpus_held(Allocation.objects.all(), "workload__project_id")
    running = _workload_counts(set(ACTIVE_STATES))
    pending = _workload_counts({WorkloadState.PENDING})
    quotas = ProjectQuota.objects.select_related("project", "pool").order_by("project__slug", "pool__name")
    return [
        QuotaUse(
            q.project.slug,
            q.pool.name,
            q.guaranteed,
            q.limit,
            held[(q.project_id, q.pool_id)],
            running.get((q.project_id, q.pool_id), 0),
            pending.get((q.project_id, q.pool_id), 0),
        )
        for q in quotas
    ]


def quota_use_in_scope() -> list[QuotaUse]:
    """Return the tenant's own quotas (project None), then its projects', each with what is held and waits there.

    A tenant row sums its projects' work in that pool, those without a
    project quota of their own included. Five queries.
    """
    held = _gpus_held(Allocation.objects.all(), "tenant_id")
    running = _pool_counts(set(ACTIVE_STATES))
    pending = _pool_counts({WorkloadState.PENDING})
    tenant_rows = [
        QuotaUse(
            None,
            q.pool.name,
            q.guaranteed,
            q.limit,
            held[(q.tenant_id, q.pool_id)],
            running.get(q.pool_id, 0),
            pending.get(q.pool_id, 0),
        )
        for q in TenantQuota.objects.select_related("pool").order_by("pool__name")
    ]
    return [*tenant_rows, *project_use_in_scope()]


def _pool_counts(states: set[str]) -> dict[int, int]:
    """Return {pool id: workloads in `states`} of the tenant in scope, in one query."""
    rows = Workload.objects.filter(state__in=states).values("pool_id").annotate(n=Count("id"))
    return {row["pool_id"]: row["n"] for row in rows}


def allocation_by_pool_and_tenant() -> list[TenantAllocation]:
    """Return every tenant quota with the GPUs the tenant's active work holds in that pool; two queries.

    Looks across tenants: operators only.
    """
    held = _gpus_held(Allocation.all_tenants.all(), "tenant_id")
    quotas = TenantQuota.all_tenants.select_related("tenant", "pool").order_by("pool__name", "tenant__slug")
    return [
        TenantAllocation(q.tenant.slug, q.pool.name, q.guaranteed, q.limit, held[(q.tenant_id, q.pool_id)])
        for q in quotas
    ]
