"""Routes of the accounting API: `tenant` is mounted under /api/v1/tenants/<tenant>/, `platform` under /api/v1/."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from accounting.api import budget_views, views

tenant = SimpleRouter(trailing_slash=True)
tenant.register("accounting", views.TenantAccountingEndpoint, basename="accounting")
tenant.register("budgets", budget_views.BudgetEndpoint, basename="budget")
tenant.register("increase-requests", budget_views.IncreaseRequestEndpoint, basename="increase-request")

platform = SimpleRouter(trailing_slash=True)
platform.register("accounting", views.PlatformAccountingEndpoint, basename="platform-accounting")
platform.register("prices", views.PriceEndpoint, basename="price")
platform.register("budgets", budget_views.PlatformBudgetEndpoint, basename="platform-budget")
