"""Routes of the web UI."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from frontend import views
from frontend.views import audit, images, inventory, jobs, launch, members, presets, quotas, usage, volumes
from frontend.views.budgets import budget_edit, budgets_page, ops_requests, request_decide, requests_page
from frontend.views.demo import demo_fleet
from frontend.views.notifications import notification_settings, ops_webhook_edit, ops_webhooks, webhook_edit, webhooks

app_name = "frontend"
urlpatterns = [
    path("", views.home, name="home"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("invite/<str:secret>/", members.invitation, name="invitation"),
    path("t/<str:tenant>/", views.overview, name="overview"),
    path("t/<str:tenant>/projects/", views.projects, name="projects"),
    path("t/<str:tenant>/projects/<str:slug>/", views.project_edit, name="project_edit"),
    path("t/<str:tenant>/members/", members.members, name="members"),
    path("t/<str:tenant>/members/<int:pk>/", members.member_edit, name="member_edit"),
    path(
        "t/<str:tenant>/members/invitations/<int:pk>/withdraw/",
        members.invitation_withdraw,
        name="invitation_withdraw",
    ),
    path("t/<str:tenant>/quotas/", quotas.quotas, name="quotas"),
    path("t/<str:tenant>/quotas/<str:kind>/<int:pk>/", quotas.quota_edit, name="quota_edit"),
    path("t/<str:tenant>/budgets/", budgets_page, name="budgets"),
    path("t/<str:tenant>/budgets/<int:pk>/", budget_edit, name="budget_edit"),
    path("t/<str:tenant>/requests/", requests_page, name="requests"),
    path("t/<str:tenant>/requests/<int:pk>/<str:verb>/", request_decide, name="request_decide"),
    path("t/<str:tenant>/tokens/", views.tokens, name="tokens"),
    path("t/<str:tenant>/tokens/<int:pk>/revoke/", views.token_revoke, name="token_revoke"),
    path("t/<str:tenant>/notifications/", notification_settings, name="notification_settings"),
    path("t/<str:tenant>/webhooks/", webhooks, name="webhooks"),
    path("t/<str:tenant>/webhooks/<int:pk>/", webhook_edit, name="webhook_edit"),
    path("t/<str:tenant>/audit/", audit.audit, name="audit"),
    path("t/<str:tenant>/audit/export.csv", audit.audit_export, name="audit_export"),
    path("t/<str:tenant>/usage/", usage.usage, name="usage"),
    path("t/<str:tenant>/usage/export.csv", usage.usage_export, name="usage_export"),
    path("t/<str:tenant>/usage/statement/", usage.statement, name="statement"),
    path("t/<str:tenant>/presets/", presets.presets_page, name="presets"),
    path("t/<str:tenant>/presets/<int:pk>/", presets.preset_edit, name="preset_edit"),
    path("t/<str:tenant>/queue/", jobs.queue, name="queue"),
    path("t/<str:tenant>/workloads/", jobs.workloads, name="workloads"),
    path("t/<str:tenant>/workloads/<int:pk>/", jobs.workload, name="workload"),
    path("t/<str:tenant>/launch/", launch.launch, name="launch"),
    path("t/<str:tenant>/storage/", volumes.storage, name="storage"),
    path("t/<str:tenant>/storage/<int:pk>/", volumes.volume, name="volume"),
    path("t/<str:tenant>/storage/<int:pk>/download/", volumes.download, name="volume_download"),
    path("ops/tenants/", views.ops_tenants, name="ops_tenants"),
    path("ops/pools/", inventory.ops_pools, name="ops_pools"),
    path("ops/pools/<str:name>/", inventory.ops_pool_edit, name="ops_pool_edit"),
    path("ops/nodes/", inventory.ops_nodes, name="ops_nodes"),
    path("ops/nodes/<str:name>/", inventory.ops_node, name="ops_node"),
    path("ops/gpus/", inventory.ops_gpus, name="ops_gpus"),
    path("ops/cluster/", inventory.ops_cluster, name="ops_cluster"),
    path("ops/cluster/demo/", demo_fleet, name="demo_fleet"),
    path("ops/allocation/", jobs.ops_allocation, name="ops_allocation"),
    path("ops/images/", images.ops_images, name="ops_images"),
    path("ops/images/<int:pk>/delete/", images.ops_image_delete, name="ops_image_delete"),
    path("ops/webhooks/", ops_webhooks, name="ops_webhooks"),
    path("ops/webhooks/<int:pk>/", ops_webhook_edit, name="ops_webhook_edit"),
    path("ops/requests/", ops_requests, name="ops_requests"),
    path("ops/usage/", usage.ops_usage, name="ops_usage"),
    path("ops/usage/export.csv", usage.ops_usage_export, name="ops_usage_export"),
    path("ops/prices/", usage.ops_prices, name="ops_prices"),
    path("ops/prices/<int:pk>/remove/", usage.ops_price_remove, name="ops_price_remove"),
]
