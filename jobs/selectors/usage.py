"""What a tenant's work holds and waits for against its quotas, now: the queue page, the API's `usage/`."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q, QuerySet

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


Counts = dict[Any, tuple[int, int]]
"""{group: (workloads placed or running, workloads waiting)}."""


def _counts(*group: str) -> Counts:
    """Return the tenant in scope's running and pending workloads by `group` (field names), in one query."""
    rows = (
        Workload.objects.filter(state__in=[*ACTIVE_STATES, WorkloadState.PENDING])
        .values(*group)
        .annotate(
            running=Count("id", filter=Q(state__in=ACTIVE_STATES)),
            pending=Count("id", filter=Q(state=WorkloadState.PENDING)),
        )
    )
    key = (lambda row: row[group[0]]) if len(group) == 1 else (lambda row: tuple(row[name] for name in group))
    return {key(row): (row["running"], row["pending"]) for row in rows}


def project_use_in_scope() -> list[QuotaUse]:
    """Return every project quota of the tenant in scope with what its project's work holds and waits for there.

    By project slug and pool name; three queries.
    """
    held = _gpus_held(Allocation.objects.all(), "workload__project_id")
    counts = _counts("project_id", "pool_id")
    quotas = ProjectQuota.objects.select_related("project", "pool").order_by("project__slug", "pool__name")
    return [
        QuotaUse(
            q.project.slug,
            q.pool.name,
            q.guaranteed,
            q.limit,
            held[(q.project_id, q.pool_id)],
            *counts.get((q.project_id, q.pool_id), (0, 0)),
        )
        for q in quotas
    ]


def quota_use_in_scope() -> list[QuotaUse]:
    """Return the tenant's own quotas (project None), then its projects', each with what is held and waits there.

    A tenant row sums its projects' work in that pool, those without a
    project quota of their own included. Six queries.
    """
    held = _gpus_held(Allocation.objects.all(), "tenant_id")
    counts = _counts("pool_id")
    tenant_rows = [
        QuotaUse(
            None,
            q.pool.name,
            q.guaranteed,
            q.limit,
            held[(q.tenant_id, q.pool_id)],
            *counts.get(q.pool_id, (0, 0)),
        )
        for q in TenantQuota.objects.select_related("pool").order_by("pool__name")
    ]
    return [*tenant_rows, *project_use_in_scope()]


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
