"""Worlds the permission contracts start from: webhook endpoints and deliveries of tenant A, tenant B and the
platform. Each may run twice on one world (the contracts' meta-tests run every setup), so each reuses what exists."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from notifications.choices import Channel, EventKind
from notifications.models import Delivery, Notification, WebhookEndpoint
from notifications.signing import new_secret
from tenants.models import Tenant
from tests.conftest import World


def _endpoint(tenant: Tenant | None, url: str, kind: EventKind) -> WebhookEndpoint:
    endpoint, _ = WebhookEndpoint.all_tenants.get_or_create(
        tenant=tenant, url=url, defaults={"kinds": [kind.value], "secret": new_secret()}
    )
    return endpoint


def _delivery(endpoint: WebhookEndpoint, kind: EventKind) -> Delivery:
    existing = Delivery.all_tenants.filter(endpoint=endpoint).first()
    if existing is not None:
        return existing
    now = timezone.now()
    notification = Notification.all_tenants.create(
        tenant=endpoint.tenant, kind=kind, subject="Job train failed", body="Exited with code 1.",
        payload={"workload": {"id": 1, "name": "train"}}, created_at=now,
    )  # fmt: skip
    return Delivery.all_tenants.create(
        tenant=endpoint.tenant, notification=notification, channel=Channel.WEBHOOK, endpoint=endpoint,
        address=endpoint.url, next_attempt_at=now, created_at=now,
    )  # fmt: skip


def webhook_world(world: World) -> dict[str, Any]:
    """Tenant A's endpoint (and one of tenant B, which A's people never see)."""
    mine = _endpoint(world.tenant_a, "https://hooks.example.com/a", EventKind.WORKLOAD_FAILED)
    _endpoint(world.tenant_b, "https://hooks.example.com/b", EventKind.WORKLOAD_FAILED)
    return {"pk": mine.pk}


def delivery_world(world: World) -> dict[str, Any]:
    """A delivery to tenant A's endpoint (and one to tenant B's)."""
    webhook_world(world)
    theirs = WebhookEndpoint.all_tenants.get(tenant=world.tenant_b)
    _delivery(theirs, EventKind.WORKLOAD_FAILED)
    mine = _delivery(WebhookEndpoint.all_tenants.get(tenant=world.tenant_a), EventKind.WORKLOAD_FAILED)
    return {"pk": mine.pk}


def platform_webhook_world(world: World) -> dict[str, Any]:
    """The platform's endpoint for node health."""
    return {"pk": _endpoint(None, "https://ops.example.com/health", EventKind.NODE_HEALTH).pk}


def platform_delivery_world(world: World) -> dict[str, Any]:
    """A delivery to the platform's endpoint."""
    endpoint = _endpoint(None, "https://ops.example.com/health", EventKind.NODE_HEALTH)
    return {"pk": _delivery(endpoint, EventKind.NODE_HEALTH).pk}
