"""The notifications API by persona: tenant admins manage their webhooks and read their delivery log, everyone
chooses their own e-mail and reads their own e-mails, operators have the platform's; other tenants get 404."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from notifications import services
from notifications.choices import Channel
from notifications.models import Delivery, Notification, NotificationPreference, WebhookEndpoint
from tenants.context import Actor
from tenants.models import AuditEvent
from tests.conftest import World, client_for

pytestmark = pytest.mark.django_db

HOOKS = "/api/v1/tenants/tenant-a/webhooks/"
B_HOOKS = "/api/v1/tenants/tenant-b/webhooks/"
DELIVERIES = "/api/v1/tenants/tenant-a/webhook-deliveries/"
CHOICES = "/api/v1/tenants/tenant-a/notification-preferences/"
EMAILS = "/api/v1/tenants/tenant-a/notification-emails/"
GOOD = {"url": "https://hooks.example.com/gpucloud", "kinds": ["workload.failed", "budget.threshold"]}


def _endpoint(world: World, url: str = "https://hooks.example.com/a") -> WebhookEndpoint:
    issued = services.create_webhook(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, url=url, kinds=["workload.failed"]
    )
    return issued.endpoint


def _failure(world: World, owner_id: int | None = None) -> Notification | None:
    return services.notify_workload_ended(
        tenant_id=world.tenant_a.pk, owner_id=owner_id or world.member_a.pk, workload_id=5, name="train",
        workload_kind="job", failed=True, reason_code="exit_nonzero", message="Exited with code 2.",
    )  # fmt: skip


def test_an_admin_adds_a_webhook_and_sees_its_secret_once(world: World) -> None:
    admin = client_for(world.admin_a)
    response = admin.post(HOOKS, GOOD, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["secret"].startswith("whsec_") and len(body["secret"]) > 40
    assert body["secret_hint"] == body["secret"][:10] + "…"
    assert body["kinds"] == ["budget.threshold", "workload.failed"] and body["created_by"] == "admin_a"
    listed = admin.get(HOOKS).json()["results"]
    assert [hook["url"] for hook in listed] == [GOOD["url"]]
    assert "secret" not in listed[0] and body["secret"] not in admin.get(f"{HOOKS}{body['id']}/").content.decode()
    event = AuditEvent.all_tenants.get(action="webhook.create")
    assert event.tenant_id == world.tenant_a.pk and body["secret"] not in str(event.after)


def test_rotating_gives_a_new_secret_that_signs_from_now_on(world: World) -> None:
    endpoint = _endpoint(world)
    response = client_for(world.admin_a).post(f"{HOOKS}{endpoint.pk}/rotate-secret/")
    assert response.status_code == 200
    secret = response.json()["secret"]
    assert secret != endpoint.secret and WebhookEndpoint.all_tenants.get(pk=endpoint.pk).secret == secret
    assert AuditEvent.all_tenants.filter(action="webhook.rotate_secret").exists()


def test_every_bad_field_is_named_at_once_and_nothing_is_written(world: World, settings: Any) -> None:
    settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = False
    admin = client_for(world.admin_a)
    before = (WebhookEndpoint.all_tenants.count(), AuditEvent.all_tenants.count())
    for body, fields in [
        ({"url": "ftp://hooks.example.com/x", "kinds": ["workload.failed", "workload.exploded", "node.health"],
          "description": "x" * 201}, {"url", "kinds", "description"}),
        ({"url": "http://10.0.0.8/hook", "kinds": []}, {"url", "kinds"}),
        ({"url": "http://169.254.169.254/latest/meta-data/", "kinds": "workload.failed"}, {"url", "kinds"}),
        ({"kinds": ["nope"]}, {"url", "kinds"}),
    ]:  # fmt: skip
        response = admin.post(HOOKS, body, format="json")
        assert response.status_code == 400, response.content
        assert set(response.json()["error"]["fields"]) == fields, response.json()
    first = admin.post(HOOKS, {"url": "ftp://x/", "kinds": ["workload.exploded", "node.health"]}, format="json")
    message = first.json()["error"]["fields"]["kinds"][0]["message"]
    assert "node.health" in message and "workload.exploded" in message
    assert (WebhookEndpoint.all_tenants.count(), AuditEvent.all_tenants.count()) == before


def test_a_metadata_address_is_refused_even_where_private_networks_are_allowed(world: World) -> None:
    response = client_for(world.admin_a).post(HOOKS, {**GOOD, "url": "http://169.254.169.254/x"}, format="json")
    assert response.status_code == 400
    assert "metadata" in response.json()["error"]["fields"]["url"][0]["message"]


def test_an_update_is_checked_the_same_way(world: World) -> None:
    endpoint = _endpoint(world)
    admin = client_for(world.admin_a)
    refused = admin.patch(f"{HOOKS}{endpoint.pk}/", {"url": "gopher://x", "kinds": ["x"]}, format="json")
    assert refused.status_code == 400 and set(refused.json()["error"]["fields"]) == {"url", "kinds"}
    changed = admin.patch(f"{HOOKS}{endpoint.pk}/", {"is_active": False, "description": "Pager"}, format="json")
    assert changed.status_code == 200 and changed.json()["is_active"] is False
    assert admin.delete(f"{HOOKS}{endpoint.pk}/").status_code == 204
    assert not WebhookEndpoint.all_tenants.exists()


def test_another_tenants_admin_cannot_see_or_touch_the_webhooks_or_their_log(world: World) -> None:
    endpoint = _endpoint(world)
    _failure(world)
    delivery = Delivery.all_tenants.get(channel=Channel.WEBHOOK)
    outsider = client_for(world.admin_b)
    for url in (HOOKS, f"{HOOKS}{endpoint.pk}/", DELIVERIES, f"{DELIVERIES}{delivery.pk}/"):
        assert outsider.get(url).status_code == 404, url
    assert outsider.patch(f"{HOOKS}{endpoint.pk}/", {"is_active": False}, format="json").status_code == 404
    assert outsider.post(f"{HOOKS}{endpoint.pk}/rotate-secret/").status_code == 404
    assert outsider.delete(f"{HOOKS}{endpoint.pk}/").status_code == 404
    # Through their own tenant's URLs, A's endpoint and deliveries do not exist either.
    assert outsider.get(B_HOOKS).json()["results"] == []
    for verb in ("get", "delete"):
        assert getattr(outsider, verb)(f"{B_HOOKS}{endpoint.pk}/").status_code == 404
    assert (
        outsider.patch(f"{B_HOOKS}{endpoint.pk}/", {"url": "https://evil.example/"}, format="json").status_code == 404
    )
    assert outsider.post(f"{B_HOOKS}{endpoint.pk}/rotate-secret/").status_code == 404
    b_log = "/api/v1/tenants/tenant-b/webhook-deliveries/"
    assert outsider.get(b_log).json()["results"] == []
    assert outsider.get(f"{b_log}{delivery.pk}/").status_code == 404
    unchanged = WebhookEndpoint.all_tenants.get(pk=endpoint.pk)
    assert (unchanged.url, unchanged.is_active, unchanged.secret) == (endpoint.url, True, endpoint.secret)


def test_members_cannot_manage_webhooks(world: World) -> None:
    member = client_for(world.member_a)
    assert member.get(HOOKS).status_code == 403
    assert member.post(HOOKS, GOOD, format="json").status_code == 403
    assert member.get(DELIVERIES).status_code == 403


def test_the_delivery_log_shows_attempts_and_is_read_in_a_fixed_number_of_queries(world: World) -> None:
    _endpoint(world)
    _failure(world)
    admin = client_for(world.admin_a)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin.get(DELIVERIES).status_code == 200
        return len(captured)

    few = queries()
    for _ in range(10):
        _failure(world)
    assert queries() == few
    [first, *_] = admin.get(DELIVERIES).json()["results"]
    assert first["kind"] == "workload.failed" and first["channel"] == "webhook" and first["state"] == "pending"
    assert first["payload"]["workload"]["name"] == "train" and first["attempt_log"] == []


def test_everyone_chooses_their_own_email(world: World) -> None:
    viewer = client_for(world.viewer_a)
    listed = viewer.get(CHOICES).json()
    assert {c["kind"]: c["email"] for c in listed} == {
        "budget.threshold": True, "budget.exhausted": True, "request.decided": True,
        "notebook.idle_warning": True, "workload.finished": False, "workload.failed": False,
        "workload.stopped": True,
    }  # fmt: skip
    response = viewer.patch(f"{CHOICES}workload.failed/", {"email": True}, format="json")
    assert response.status_code == 200 and response.json() == {
        "kind": "workload.failed", "title": "Workload failed", "email": True, "by_default": False,
    }  # fmt: skip
    assert viewer.get(f"{CHOICES}workload.failed/").json()["email"] is True
    assert client_for(world.member_a).get(f"{CHOICES}workload.failed/").json()["email"] is False, "choices are own"
    assert viewer.patch(f"{CHOICES}node.health/", {"email": True}, format="json").status_code == 404
    bad = viewer.patch(f"{CHOICES}workload.failed/", {"email": "maybe"}, format="json")
    assert bad.status_code == 400 and "email" in bad.json()["error"]["fields"]
    assert client_for(world.admin_b).get(CHOICES).status_code == 404
    assert NotificationPreference.all_tenants.count() == 1


def test_people_read_their_own_emails_only(world: World, settings: Any) -> None:
    settings.NOTIFICATIONS_EMAIL = True
    for user in (world.member_a, world.admin_a):
        NotificationPreference.all_tenants.create(tenant=world.tenant_a, user=user, kind="workload.failed", email=True)
        _failure(world, owner_id=user.pk)
    mine = client_for(world.member_a).get(EMAILS).json()["results"]
    assert [(e["address"], e["channel"]) for e in mine] == [("member_a@example.com", "email")]
    assert client_for(world.viewer_a).get(EMAILS).json()["results"] == []
    assert client_for(world.admin_b).get(EMAILS).status_code == 404


def test_operators_manage_the_platform_webhooks_and_their_own_node_health_email(world: World) -> None:
    operator = client_for(world.operator)
    created = operator.post(
        "/api/v1/webhooks/", {"url": "https://ops.example.com/in", "kinds": ["node.health"]}, format="json"
    )
    assert created.status_code == 201 and created.json()["secret"].startswith("whsec_")
    tenant_kind = operator.post(
        "/api/v1/webhooks/", {"url": "https://ops.example.com/in", "kinds": ["workload.failed"]}, format="json"
    )
    assert tenant_kind.status_code == 400 and "kinds" in tenant_kind.json()["error"]["fields"]
    assert WebhookEndpoint.all_tenants.get().tenant_id is None
    assert operator.get(HOOKS).json()["results"] == [], "a tenant's list holds only its own"
    choice = operator.patch("/api/v1/notification-preferences/node.health/", {"email": False}, format="json")
    assert choice.status_code == 200 and choice.json()["email"] is False
    for url in ("/api/v1/webhooks/", "/api/v1/webhook-deliveries/", "/api/v1/notification-preferences/"):
        assert client_for(world.admin_a).get(url).status_code == 403, url
