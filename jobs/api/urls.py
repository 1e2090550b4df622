"""Routes of the jobs API, mounted under /api/v1/tenants/<tenant>/."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from jobs.api import views

tenant = SimpleRouter(trailing_slash=True)
tenant.register("workloads/bulk", views.WorkloadBulkEndpoint, basename="workload-bulk")
tenant.register("workloads", views.WorkloadEndpoint, basename="workload")
