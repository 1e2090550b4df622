"""Django admin of the accounting app: read-only views of prices, budgets, requests for more and rollups.

Everything here is the ledger or is changed only by a workflow with rules the
admin's forms do not know (a price takes effect from a date and only a future
one may be removed; budgets and requests are checked, audited and notified
through `accounting.services`), so operators read here and change on the
console pages or through the API.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from accounting.models import Budget, IncreaseRequest, Price, RollupMark, UsageHour
from tenants.admin import ReadOnlyAdmin


@admin.register(Price)
class PriceAdmin(ReadOnlyAdmin):
    list_display = ["id", "resource", "pool", "gpu_model", "amount_per_hour", "effective_from", "created_by"]
    list_filter = ["resource"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Price]:
        return Price.objects.select_related("pool", "created_by")


@admin.register(Budget)
class BudgetAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "project", "unit", "amount", "period", "soft_percent", "hard_action"]
    list_filter = ["unit", "period", "hard_action"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Budget]:
        return Budget.all_tenants.select_related("tenant", "project")


@admin.register(IncreaseRequest)
class IncreaseRequestAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "project", "requester", "kind", "state", "ends_at", "created_at"]
    list_filter = ["kind", "state"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[IncreaseRequest]:
        return IncreaseRequest.all_tenants.select_related("tenant", "project", "requester", "pool", "budget")


@admin.register(UsageHour)
class UsageHourAdmin(ReadOnlyAdmin):
    list_display = ["id", "hour", "tenant", "project", "owner", "pool", "gpu_model", "gpu_seconds"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[UsageHour]:
        return UsageHour.all_tenants.select_related("tenant", "project", "owner", "pool")


@admin.register(RollupMark)
class RollupMarkAdmin(ReadOnlyAdmin):
    list_display = ["id", "rolled_from", "settled_until", "updated_at"]
