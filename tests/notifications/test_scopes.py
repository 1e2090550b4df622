"""Notifications read and write the rows of the tenant named (or the platform's), whatever scope the caller holds.

The controller raises notifications with no scope; pages and the API hold
their URL's tenant. Each case runs with no scope active and with the other
tenant's, and a second tenant's rows exist that must stay unseen and untouched.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import pytest

from notifications import selectors, services
from notifications.choices import Channel, EventKind
from notifications.models import Delivery, Notification, NotificationPreference, WebhookEndpoint
from notifications.services.webhooks import MAX_ENDPOINTS
from notifications.signing import new_secret
from tenants.models import Tenant
from tenants.scoping import tenant_scope
from tests.conftest import World, actor

KIND = EventKind.BUDGET_THRESHOLD  # a tenant's kind, e-mailed unless one says no


@pytest.fixture(params=["no scope", "the other tenant's scope"])
def caller(request: pytest.FixtureRequest, world: World) -> Tenant | None:
    """The scope the caller holds while the services name tenant A: none, or tenant B's."""
    return None if request.param == "no scope" else world.tenant_b


def _held(scope: Tenant | None) -> AbstractContextManager[object]:
    return tenant_scope(scope) if scope is not None else nullcontext()


def test_email_choices_are_the_named_tenants_own(world: World, caller: Tenant | None) -> None:
    NotificationPreference.all_tenants.create(tenant=world.tenant_b, user=world.admin_a, kind=KIND, email=False)
    with _held(caller):
        before = {c.kind: c.email for c in selectors.email_choices(world.admin_a, world.tenant_a.pk)}
        after = services.set_email_choices(actor=actor(world.admin_a), tenant=world.tenant_a, choices={KIND: False})
    assert before[KIND] is True, "tenant B's choice is not tenant A's"
    assert {c.kind: c.email for c in after}[KIND] is False
    assert sorted(NotificationPreference.all_tenants.values_list("tenant_id", "email")) == sorted(
        [(world.tenant_a.pk, False), (world.tenant_b.pk, False)]
    )


def test_the_platforms_choices_are_apart_from_every_tenants(world: World, caller: Tenant | None) -> None:
    NotificationPreference.all_tenants.create(tenant=world.tenant_a, user=world.operator, kind=KIND, email=False)
    with _held(caller):
        choices = services.set_email_choices(
            actor=actor(world.operator), tenant=None, choices={EventKind.NODE_HEALTH: True}
        )
    assert [(c.kind, c.email) for c in choices] == [(EventKind.NODE_HEALTH.value, True)]
    assert NotificationPreference.all_tenants.get(tenant__isnull=True).email is True
    assert NotificationPreference.all_tenants.get(tenant=world.tenant_a).email is False, "tenant A's stays"


def test_the_endpoint_limit_counts_the_named_tenants_endpoints(world: World, caller: Tenant | None) -> None:
    WebhookEndpoint.all_tenants.bulk_create(
        WebhookEndpoint(tenant=world.tenant_b, url=f"https://b.example.com/{n}", kinds=[KIND], secret=new_secret())
        for n in range(MAX_ENDPOINTS)
    )
    with _held(caller):
        issued = services.create_webhook(
            actor=actor(world.admin_a), tenant=world.tenant_a, url="https://a.example.com/", kinds=[KIND]
        )
        changed = services.update_webhook(
            actor=actor(world.admin_a), endpoint=issued.endpoint, changes={"description": "A"}
        )
    assert issued.endpoint.tenant_id == world.tenant_a.pk
    assert changed.pk == issued.endpoint.pk


def test_a_notification_goes_to_the_named_tenants_endpoints_only(world: World, caller: Tenant | None) -> None:
    for tenant in (world.tenant_a, world.tenant_b):
        WebhookEndpoint.all_tenants.create(tenant=tenant, url="https://hooks.example.com/", kinds=[KIND], secret="s")
    with _held(caller):
        sent = services.notify(KIND, tenant=world.tenant_a, subject="Budget", body="80 %", payload={})
    assert sent is not None and sent.tenant_id == world.tenant_a.pk
    assert list(Delivery.all_tenants.values_list("tenant_id", "channel")) == [(world.tenant_a.pk, Channel.WEBHOOK)]
    assert Notification.all_tenants.count() == 1
