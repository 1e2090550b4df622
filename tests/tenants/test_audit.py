"""The audit log: exactly one event per state-changing action, none for refusals, and no way to change it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError, transaction

from tenants import services
from tenants.context import Actor
from tenants.models import AuditEvent, Membership, ProjectQuota
from tests.conftest import World, client_for


def _project_quota(world: World) -> ProjectQuota:
    return ProjectQuota.all_tenants.create(
        tenant=world.tenant_a, project=world.project_a, pool=world.pool, guaranteed=1, limit=2
    )


def _token(world: World) -> int:
    return services.create_token(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, name="t", role="viewer", expires_in_days=1
    ).token.pk


T = "/api/v1/tenants/tenant-a"
# (who, method, url or url builder, body, expected action, tenant of the event: "a" or None)
WRITES: list[tuple[str, str, Any, dict[str, Any] | None, str, str | None]] = [
    ("operator", "post", "/api/v1/tenants/", {"slug": "tenant-c", "name": "C"}, "tenant.create", "c"),
    ("operator", "patch", "/api/v1/tenants/tenant-a/", {"name": "A!"}, "tenant.update", "a"),
    ("admin_a", "post", f"{T}/projects/", {"slug": "gamma", "name": "G"}, "project.create", "a"),
    ("admin_a", "patch", f"{T}/projects/alpha/", {"name": "A2"}, "project.update", "a"),
    ("admin_a", "delete", f"{T}/projects/alpha/", None, "project.delete", "a"),
    ("admin_a", "post", f"{T}/invitations/", {"username": "pal", "role": "viewer"}, "invitation.create", "a"),
    (
        "admin_a",
        "patch",
        lambda w: f"{T}/memberships/{Membership.all_tenants.get(user=w.member_a).pk}/",
        {"role": "viewer"},
        "membership.update",
        "a",
    ),
    (
        "admin_a",
        "delete",
        lambda w: f"{T}/memberships/{Membership.all_tenants.get(user=w.member_a).pk}/",
        None,
        "membership.delete",
        "a",
    ),
    ("operator", "patch", lambda w: f"{T}/quotas/{w.quota_a.pk}/", {"limit": 20}, "tenant_quota.update", "a"),
    ("operator", "delete", lambda w: f"{T}/quotas/{w.quota_a.pk}/", None, "tenant_quota.delete", "a"),
    (
        "admin_a",
        "post",
        f"{T}/project-quotas/",
        {"project": "alpha", "pool": "shared", "limit": 2},
        "project_quota.create",
        "a",
    ),
    (
        "admin_a",
        "patch",
        lambda w: f"{T}/project-quotas/{_project_quota(w).pk}/",
        {"limit": 3},
        "project_quota.update",
        "a",
    ),
    ("admin_a", "delete", lambda w: f"{T}/project-quotas/{_project_quota(w).pk}/", None, "project_quota.delete", "a"),
    ("operator", "post", "/api/v1/node-pools/", {"name": "fresh"}, "node_pool.create", None),
    ("operator", "patch", "/api/v1/node-pools/shared/", {"description": "d"}, "node_pool.update", None),
    (
        "admin_a",
        "post",
        "/api/v1/tokens/",
        {"name": "t", "tenant": "tenant-a", "role": "viewer"},
        "api_token.create",
        "a",
    ),
    ("admin_a", "delete", lambda w: f"/api/v1/tokens/{_token(w)}/", None, "api_token.revoke", "a"),
    ("admin_a", "delete", lambda w: f"{T}/tokens/{_token(w)}/", None, "api_token.revoke", "a"),
]


@pytest.mark.parametrize(
    ("who", "method", "url", "body", "action", "tenant"), WRITES, ids=[f"{w[4]}-{w[1]}" for w in WRITES]
)
def test_every_write_records_exactly_one_event(
    world: World, who: str, method: str, url: Any, body: Any, action: str, tenant: str | None
) -> None:
    target = url(world) if callable(url) else url
    before = AuditEvent.all_tenants.count()
    client = client_for(getattr(world, who))
    response = getattr(client, method)(
        target, body, format="json", HTTP_X_REQUEST_ID="req-0123456789", REMOTE_ADDR="10.9.8.7"
    )
    assert 200 <= response.status_code < 300, response.content
    events = list(AuditEvent.all_tenants.order_by("id")[before:])
    assert [e.action for e in events] == [action]
    event = events[0]
    assert event.actor_label == who and event.actor_id == getattr(world, who).pk
    assert event.via == "api"
    assert event.request_id == "req-0123456789" == response["X-Request-ID"]
    assert event.source_ip == "10.9.8.7"
    assert event.object_type and event.object_id
    expected_tenant = {"a": world.tenant_a.pk, None: None}.get(tenant, "new")
    if expected_tenant != "new":
        assert event.tenant_id == expected_tenant
    if method == "patch":
        assert event.before and event.after and event.before != event.after
    if method == "delete" and action != "api_token.revoke":
        assert event.before and event.after is None


@pytest.mark.parametrize(
    ("who", "method", "url", "body"),
    [
        ("viewer_a", "post", f"{T}/projects/", {"slug": "x", "name": "X"}),
        ("admin_b", "patch", f"{T}/projects/alpha/", {"name": "X"}),
        (
            "admin_a",
            "post",
            f"{T}/project-quotas/",
            {"project": "alpha", "pool": "shared", "guaranteed": 9, "limit": 17},
        ),
        ("operator", "delete", "/api/v1/node-pools/shared/", None),
        ("admin_a", "patch", f"{T}/projects/alpha/", {"name": ""}),
    ],
)
def test_refused_requests_record_nothing(world: World, who: str, method: str, url: str, body: Any) -> None:
    before = AuditEvent.all_tenants.count()
    response = getattr(client_for(getattr(world, who)), method)(url, body, format="json")
    assert response.status_code >= 400
    assert AuditEvent.all_tenants.count() == before


@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_to_change_or_delete_events(world: World) -> None:
    services.update_project(actor=Actor(user=world.admin_a), project=world.project_a, name="Changed")
    event = AuditEvent.all_tenants.latest("id")
    attempts: list[Callable[[], Any]] = [
        lambda: AuditEvent.all_tenants.filter(pk=event.pk).update(action="forged"),
        lambda: AuditEvent.all_tenants.filter(pk=event.pk).delete(),
        lambda: AuditEvent.all_tenants.get(pk=event.pk).delete(),
        lambda: _save_changed(event),
    ]
    for attempt in attempts:
        with pytest.raises(DatabaseError), transaction.atomic():
            attempt()
    assert AuditEvent.all_tenants.get(pk=event.pk).action == "project.update"


def _save_changed(event: AuditEvent) -> None:
    event.action = "forged"
    event.save()


def test_tenant_admins_read_their_tenant_and_operators_read_all(world: World) -> None:
    services.update_project(actor=Actor(user=world.admin_a), project=world.project_a, name="A")
    services.update_project(actor=Actor(user=world.admin_b), project=world.project_b, name="B")
    mine = client_for(world.admin_a).get("/api/v1/tenants/tenant-a/audit-events/").json()["results"]
    assert [e["object_repr"] for e in mine] == ["alpha"]
    assert client_for(world.admin_a).get("/api/v1/audit-events/").status_code == 403
    everything = client_for(world.operator).get("/api/v1/audit-events/?action=project.update").json()
    assert everything["count"] == 2
    filtered = client_for(world.operator).get(f"/api/v1/audit-events/?tenant={world.tenant_b.pk}").json()
    assert [e["object_repr"] for e in filtered["results"]] == ["beta"]
