"""Pages about workloads: a tenant's queue (why work waits, where it runs) and operators' allocation view."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend import selectors
from frontend.access import Page, operator_view, tenant_view
from tenants.choices import Role


@tenant_view(Role.VIEWER)
def queue(request: HttpRequest, page: Page) -> HttpResponse:
    """Waiting work with its reason, position and hint; active work with its GPUs; each project's use per pool."""
    waiting, active = selectors.queue_in_scope()
    context = {"page": page, "waiting": waiting, "active": active, "use": selectors.project_use_in_scope()}
    return render(request, "frontend/queue.html", context)


@operator_view
def ops_allocation(request: HttpRequest) -> HttpResponse:
    """Every tenant's GPUs in use per pool against its guarantee and limit."""
    return render(request, "frontend/ops_allocation.html", {"rows": selectors.allocation_by_pool_and_tenant()})
