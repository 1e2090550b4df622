"""Routes of the notifications API: `tenant` is mounted under /api/v1/tenants/<tenant>/, `platform` under /api/v1/."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from notifications.api import views

tenant = SimpleRouter(trailing_slash=True)
tenant.register("webhooks", views.TenantWebhookEndpoint, basename="webhook")
tenant.register("webhook-deliveries", views.TenantWebhookDeliveryEndpoint, basename="webhook-delivery")
tenant.register("notification-emails", views.TenantEmailEndpoint, basename="notification-email")
tenant.register("notification-preferences", views.TenantEmailChoiceEndpoint, basename="notification-preference")

platform = SimpleRouter(trailing_slash=True)
platform.register("webhooks", views.PlatformWebhookEndpoint, basename="platform-webhook")
platform.register("webhook-deliveries", views.PlatformWebhookDeliveryEndpoint, basename="platform-webhook-delivery")
platform.register("notification-emails", views.PlatformEmailEndpoint, basename="platform-notification-email")
platform.register(
    "notification-preferences", views.PlatformEmailChoiceEndpoint, basename="platform-notification-preference"
)
