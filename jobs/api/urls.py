"""Routes of the jobs API: `tenant` is mounted under /api/v1/tenants/<tenant>/, `platform` under /api/v1/."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from jobs.api import views

tenant = SimpleRouter(trailing_slash=True)
tenant.register("workloads/bulk", views.WorkloadBulkEndpoint, basename="workload-bulk")
tenant.register("workloads", views.WorkloadEndpoint, basename="workload")
tenant.register("images", views.TenantImageEndpoint, basename="tenant-image")
tenant.register("presets", views.LaunchPresetEndpoint, basename="preset")
tenant.register("usage", views.UsageEndpoint, basename="usage")

platform = SimpleRouter(trailing_slash=True)
platform.register("images", views.AllowedImageEndpoint, basename="allowed-image")
