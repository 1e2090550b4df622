"""The Django admin: operators only, every change through the services and audited once, audit read-only."""

from __future__ import annotations

from django.test import Client
from django.urls import reverse

from inventory.models import NodePool
from tenants.models import AuditEvent, Membership, Tenant
from tests.conftest import PASSWORD, World


def _login(client: Client, username: str) -> None:
    assert client.login(username=username, password=PASSWORD)


def test_non_operators_cannot_enter_the_admin(world: World, client: Client) -> None:
    _login(client, "admin_a")
    response = client.get(reverse("admin:tenants_tenant_changelist"))
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_admin_tenant_change_goes_through_the_service_with_one_audit_event(world: World, client: Client) -> None:
    _login(client, "operator")
    before = AuditEvent.all_tenants.count()
    url = reverse("admin:tenants_tenant_change", args=[world.tenant_a.pk])
    response = client.post(url, {"name": "Tenant A renamed", "description": "", "is_active": "on"})
    assert response.status_code == 302, response.content[:500]
    assert Tenant.objects.get(pk=world.tenant_a.pk).name == "Tenant A renamed"
    events = AuditEvent.all_tenants.order_by("-id")[: AuditEvent.all_tenants.count() - before]
    assert [(e.action, e.via, e.actor_label) for e in events] == [("tenant.update", "admin", "operator")]


def test_admin_pool_rule_violation_is_shown_and_nothing_is_written(world: World, client: Client) -> None:
    _login(client, "operator")
    before = AuditEvent.all_tenants.count()
    url = reverse("admin:inventory_nodepool_change", args=[world.pool.pk])
    # Tenant A holds quota in the pool, so it cannot be dedicated to tenant B.
    data = {
        "description": "x",
        "dedicated_tenant": world.tenant_b.pk,
        "placement_policy": "binpack",
        "usage_half_life_seconds": world.pool.usage_half_life_seconds,
    }
    response = client.post(url, data, follow=True)
    assert response.status_code == 200
    assert b"Other tenants hold quota in this pool" in response.content
    assert NodePool.objects.get(pk=world.pool.pk).dedicated_tenant is None
    assert AuditEvent.all_tenants.count() == before


def test_audit_events_are_read_only_in_the_admin(world: World, client: Client) -> None:
    _login(client, "operator")
    client.post(reverse("admin:tenants_tenant_change", args=[world.tenant_a.pk]), {"name": "N", "is_active": "on"})
    event = AuditEvent.all_tenants.first()
    assert event is not None
    assert client.get(reverse("admin:tenants_auditevent_changelist")).status_code == 200
    change = client.post(reverse("admin:tenants_auditevent_change", args=[event.pk]), {"action": "forged"})
    assert change.status_code == 403
    assert client.post(reverse("admin:tenants_auditevent_delete", args=[event.pk]), {"post": "yes"}).status_code == 403
    assert AuditEvent.all_tenants.get(pk=event.pk).action == "tenant.update"


def test_admin_login_is_throttled_like_the_console(world: World, client: Client, settings) -> None:
    settings.AXES_ENABLED = True
    url = reverse("admin:login")
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post(url, {"username": "operator", "password": "wrong", "next": "/admin/"})
    response = client.post(url, {"username": "operator", "password": PASSWORD, "next": "/admin/"})
    assert response.status_code == 429, "a locked account must not get in, even with the right password"
    assert not response.wsgi_request.user.is_authenticated


def test_operators_can_open_every_tenant_owned_change_page(world: World, client: Client) -> None:
    """The read-only change pages of scoped models (memberships and the rest) render for operators, not 500."""
    _login(client, "operator")
    membership = Membership.all_tenants.filter(tenant=world.tenant_a).first()
    assert membership is not None
    response = client.get(reverse("admin:tenants_membership_change", args=[membership.pk]))
    assert response.status_code == 200
    assert membership.user.get_username() in response.content.decode()
    assert client.get(reverse("admin:tenants_membership_changelist")).status_code == 200
