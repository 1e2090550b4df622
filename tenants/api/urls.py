"""Routes of the tenancy API."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from tenants.api import views

platform = SimpleRouter(trailing_slash=True)
platform.register("tenants", views.TenantEndpoint, basename="tenant")
platform.register("tokens", views.TokenEndpoint, basename="token")
platform.register("audit-events", views.PlatformAuditEventEndpoint, basename="platform-audit-event")
platform.register("me", views.MeEndpoint, basename="me")
platform.register("invitations", views.InvitationToMeEndpoint, basename="invitation-to-me")

tenant = SimpleRouter(trailing_slash=True)
tenant.register("projects", views.ProjectEndpoint, basename="project")
tenant.register("memberships", views.MembershipEndpoint, basename="membership")
tenant.register("invitations", views.InvitationEndpoint, basename="invitation")
tenant.register("quotas", views.TenantQuotaEndpoint, basename="tenant-quota")
tenant.register("project-quotas", views.ProjectQuotaEndpoint, basename="project-quota")
tenant.register("tokens", views.TenantTokenEndpoint, basename="tenant-token")
tenant.register("audit-events", views.AuditEventEndpoint, basename="audit-event")
