"""Django admin of the jobs app: read-only views of workloads, allocations and events for operators.

Workloads change only through the services and the scheduler (compare-and-
swap, events, audit), never through a model form.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs.models import Allocation, Workload, WorkloadEvent
from tenants.admin import ReadOnlyAdmin


@admin.register(Workload)
class WorkloadAdmin(ReadOnlyAdmin):
    list_display = ["id", "name", "tenant", "project", "owner", "kind", "state", "pool", "submitted_at"]
    list_filter = ["state", "kind", "priority_class"]
    search_fields = ["name", "image"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Workload]:
        return Workload.all_tenants.select_related("tenant", "project", "owner", "pool")


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyAdmin):
    list_display = ["id", "workload", "replica", "node", "gpu", "created_at", "released_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Allocation]:
        return Allocation.all_tenants.select_related("workload", "node", "gpu", "gpu__node")


@admin.register(WorkloadEvent)
class WorkloadEventAdmin(ReadOnlyAdmin):
    list_display = ["id", "workload", "kind", "from_state", "to_state", "reason_code", "created_at"]
    list_filter = ["kind"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkloadEvent]:
        return WorkloadEvent.all_tenants.select_related("workload")
