"""Scoped reads of workloads and of what they are launched from: launch presets and allowed images.

All run under the active tenant scope, except `active_allocations_by_node`
(across tenants, for the drain rule) and the image patterns, which are not
tenant-owned rows and say whose they read.
"""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import Count, F, Prefetch, Q, QuerySet

from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Allocation, AllowedImage, LaunchPreset, Workload, WorkloadEvent
from tenants.models import Project


def workloads_for_tenant(
    *,
    state: str | None = None,
    project: Project | None = None,
    owner: User | None = None,
    kind: str | None = None,
) -> QuerySet[Workload]:
    """Return the active tenant's workloads, newest first, with project, pool and owner loaded; filters are optional."""
    workloads = Workload.objects.select_related("project", "pool", "owner")
    if state is not None:
        workloads = workloads.filter(state=state)
    if project is not None:
        workloads = workloads.filter(project=project)
    if owner is not None:
        workloads = workloads.filter(owner=owner)
    if kind is not None:
        workloads = workloads.filter(kind=kind)
    return workloads


def notebooks_awaiting_owner(owner: User) -> QuerySet[Workload]:
    """Return `owner`'s notebooks in the active tenant that ask something of them, newest first.

    Those warned as idle (running, warned, not extended: keep or hibernate
    them now) and the hibernated ones (resume them).
    """
    warned = Q(state=WorkloadState.RUNNING, idle_warned_at__isnull=False, idle_extended_at__isnull=True)
    return (
        Workload.objects.select_related("project", "pool")
        .filter(warned | Q(state=WorkloadState.HIBERNATED), owner=owner, kind=WorkloadKind.NOTEBOOK)
        .order_by(F("idle_warned_at").desc(nulls_last=True), "-pk")
    )


def workloads_with_details() -> QuerySet[Workload]:
    """Return the active tenant's workloads with their allocations (node and GPU) and events prefetched.

    Events come in the order they were written, not by their timestamps: a
    scheduling pass stamps its events with the moment it began, which can
    precede a submission that committed while it read, and every event of a
    workload is written after reading the state the one before it left.
    """
    allocations = Allocation.objects.select_related("node", "gpu").order_by("replica", "id")
    return workloads_for_tenant().prefetch_related(
        Prefetch("allocations", queryset=allocations),
        Prefetch("events", queryset=WorkloadEvent.objects.order_by("id")),
    )


def workload_detail(workload_id: int) -> Workload | None:
    """Return one of the active tenant's workloads with allocations and events loaded, or None."""
    return workloads_with_details().filter(pk=workload_id).first()


def active_allocations_by_node(node_ids: list[int]) -> dict[int, int]:
    """Return {node id: active allocations on it} for `node_ids`; looks across tenants (the drain rule needs all)."""
    rows = (
        Allocation.all_tenants.filter(node_id__in=node_ids, released_at__isnull=True)
        .values("node_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {row["node_id"]: row["n"] for row in rows}


def presets_for_tenant() -> QuerySet[LaunchPreset]:
    """Return the active tenant's launch presets by name, with their pools loaded."""
    return LaunchPreset.objects.select_related("pool").order_by("name")


def allowed_images_for_tenant(tenant_id: int) -> QuerySet[AllowedImage]:
    """Return the image patterns that apply to one tenant: its own and the platform-wide ones, never another's.

    Allowed images are not tenant-owned rows (platform-wide ones have no
    tenant), so this names the tenant instead of relying on the scope.
    """
    return AllowedImage.objects.filter(Q(tenant_id=tenant_id) | Q(tenant__isnull=True)).select_related("tenant")


def allowed_images_for_operators() -> QuerySet[AllowedImage]:
    """Return every image pattern of the platform, platform-wide ones first, then by tenant and pattern."""
    return AllowedImage.objects.select_related("tenant").order_by(F("tenant__slug").asc(nulls_first=True), "pattern")
