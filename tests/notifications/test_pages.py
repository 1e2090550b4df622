"""The notification pages: each person's e-mail choices, a tenant's webhooks, the operators' platform page."""

from __future__ import annotations

from typing import Any

import pytest

from notifications import services
from notifications.models import NotificationPreference, WebhookEndpoint
from tenants.context import Actor
from tests.conftest import World
from tests.frontend.test_pages import logged_in

pytestmark = pytest.mark.django_db

SETTINGS = "/t/tenant-a/notifications/"
HOOKS = "/t/tenant-a/webhooks/"


def test_a_member_turns_on_failed_workloads_and_off_idle_warnings(world: World) -> None:
    client = logged_in("member_a")
    page = client.get(SETTINGS).content.decode()
    assert "Workload failed" in page and 'id="email-off"' in page, "no mail server: the page says so"
    response = client.post(SETTINGS, {"mail-save": "1", "mail-workload.failed": "on", "mail-budget.threshold": "on"})
    assert response.status_code == 302
    chosen = dict(NotificationPreference.all_tenants.filter(user=world.member_a).values_list("kind", "email"))
    assert chosen["workload.failed"] is True and chosen["notebook.idle_warning"] is False
    assert chosen["workload.finished"] is False and chosen["budget.threshold"] is True


def test_an_admin_adds_a_webhook_sees_the_secret_once_then_rotates_and_removes_it(world: World) -> None:
    client = logged_in("admin_a")
    added = client.post(
        HOOKS, {"add": "1", "hook-url": "https://hooks.example.com/in", "hook-kinds": ["workload.failed"]}
    )
    assert added.status_code == 302
    endpoint = WebhookEndpoint.all_tenants.get()
    first = client.get(HOOKS).content.decode()
    assert endpoint.secret in first and 'id="new-secret"' in first
    assert endpoint.secret not in client.get(HOOKS).content.decode(), "shown once"
    client.post(f"{HOOKS}{endpoint.pk}/", {"action": "rotate"})
    rotated = WebhookEndpoint.all_tenants.get().secret
    assert rotated != endpoint.secret and rotated in client.get(HOOKS).content.decode()
    client.post(f"{HOOKS}{endpoint.pk}/", {"action": "toggle"})
    assert WebhookEndpoint.all_tenants.get().is_active is False
    client.post(f"{HOOKS}{endpoint.pk}/", {"action": "remove"})
    assert not WebhookEndpoint.all_tenants.exists()


def test_bad_webhook_input_lands_on_the_form_fields(world: World, settings: Any) -> None:
    settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = False
    response = logged_in("admin_a").post(HOOKS, {"add": "1", "hook-url": "http://10.0.0.1/x", "hook-kinds": []})
    page = response.content.decode()
    assert response.status_code == 200 and 'data-field="url"' in page and 'data-field="kinds"' in page
    assert not WebhookEndpoint.all_tenants.exists()


def test_the_deliveries_show_on_the_webhooks_page(world: World) -> None:
    services.create_webhook(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, url="https://hooks.example.com/in",
        kinds=["workload.failed"],
    )  # fmt: skip
    services.notify_workload_ended(
        tenant_id=world.tenant_a.pk, owner_id=world.member_a.pk, workload_id=3, name="train", workload_kind="job",
        failed=True, reason_code="exit_nonzero", message="Exited with code 1.",
    )  # fmt: skip
    page = logged_in("admin_a").get(HOOKS).content.decode()
    assert 'data-state="pending"' in page and "workload.failed" in page
    assert logged_in("admin_b").get(HOOKS).status_code == 404


def test_operators_add_a_platform_webhook_and_choose_their_node_health_email(world: World) -> None:
    client = logged_in("operator")
    client.post("/ops/webhooks/", {"add": "1", "hook-url": "https://ops.example.com/in", "hook-kinds": ["node.health"]})
    assert WebhookEndpoint.all_tenants.get().tenant_id is None
    client.post("/ops/webhooks/", {"mail-save": "1"})
    assert NotificationPreference.all_tenants.get(user=world.operator).email is False
    assert logged_in("admin_a").get("/ops/webhooks/").status_code == 404
