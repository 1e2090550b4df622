"""URL root: the API under /api/v1/, health and metrics, the Django admin for operators, the web UI everywhere else."""

from __future__ import annotations

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from accounting.api import urls as accounting_api
from gpucloud import views
from inventory.api import urls as inventory_api
from jobs.api import agent as agent_gateway
from jobs.api import urls as jobs_api
from notifications.api import urls as notifications_api
from tenants.api import urls as tenants_api

api_v1: list[URLPattern | URLResolver] = [
    # The agent gateway: node credentials only (jobs.api.agent); no trailing slash, as agents call them.
    path("agent/join", agent_gateway.AgentJoinEndpoint.as_view(), name="agent-join"),
    path("agent/reports", agent_gateway.AgentReportsEndpoint.as_view(), name="agent-reports"),
    path("agent/commands", agent_gateway.AgentCommandsEndpoint.as_view(), name="agent-commands"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its script as a file: the Content-Security-Policy allows no inline script.
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api:schema"), name="docs"),
    path("tenants/<str:tenant>/", include(tenants_api.tenant.urls)),
    path("tenants/<str:tenant>/", include(jobs_api.tenant.urls)),
    path("tenants/<str:tenant>/", include(inventory_api.tenant.urls)),
    path("tenants/<str:tenant>/", include(accounting_api.tenant.urls)),
    path("tenants/<str:tenant>/", include(notifications_api.tenant.urls)),
    path("", include(tenants_api.platform.urls)),
    path("", include(inventory_api.platform.urls)),
    path("", include(jobs_api.platform.urls)),
    path("", include(accounting_api.platform.urls)),
    path("", include(notifications_api.platform.urls)),
]

handler500 = "gpucloud.views.server_error"

urlpatterns = [
    path("api/v1/", include((api_v1, "api"))),
    re_path(r"^api/", views.api_not_found),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    # Notebooks are served on their own origin: the console only hands the browser over (jobs.views).
    path("notebooks/", include("jobs.urls")),
    path("", include("frontend.urls")),
]
