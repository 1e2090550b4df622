"""The audit log page: subjects and changes in words (old events too), filters, and the CSV export."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from django.http import StreamingHttpResponse
from django.test import Client
from django.utils import timezone

from tenants import services
from tenants.context import Actor
from tenants.models import AuditEvent, Membership, ProjectQuota
from tenants.scoping import tenant_scope
from tests.conftest import PASSWORD, World

AUDIT = "/t/tenant-a/audit/"


def _admin() -> Client:
    client = Client()
    assert client.login(username="admin_a", password=PASSWORD)
    return client


def _history(world: World) -> None:
    """A project quota set and changed by the admin, a member invited, and one event of tenant B."""
    admin = Actor(user=world.admin_a)
    quota = services.create_project_quota(
        actor=admin, project=world.project_a, pool=world.pool, values=services.QuotaValues(guaranteed=1, limit=2)
    )
    services.update_project_quota(actor=admin, quota=quota, changes={"guaranteed": 2, "limit": None})
    with tenant_scope(world.tenant_a):  # as the members page runs it
        issued = services.invite_member(actor=admin, tenant=world.tenant_a, username="dan", projects=["alpha"])
    secret = issued.link_path.rstrip("/").rsplit("/", 1)[-1]
    services.create_invited_account(secret=secret, password="a brand new passphrase 42")
    services.create_project(actor=Actor(user=world.admin_b), tenant=world.tenant_b, slug="secret-b", name="B")


def test_subjects_and_changes_read_as_names_before_and_after(world: World) -> None:
    _history(world)
    page = _admin().get(AUDIT).content.decode()
    assert "project quota alpha in pool shared" in page
    assert "guaranteed GPUs: 1 → 2" in page and "GPU limit: 2 → no limit" in page
    assert "member dan" in page and "projects: alpha" in page
    assert "secret-b" not in page, "another tenant's events never show"


def test_events_from_before_readable_labels_are_named_as_well_as_they_can_be(world: World) -> None:
    """Old rows named memberships "3@1:member" and quotas "2/1: 1..2", with ids in their snapshots."""
    old = {"tenant_id": world.tenant_a.pk, "actor_label": "admin_a", "via": "ui"}
    AuditEvent.all_tenants.create(
        **old,
        action="membership.update",
        object_type="membership",
        object_repr=f"{world.member_a.pk}@{world.tenant_a.pk}:member",
        before={"role": "viewer"},
        after={"role": "member"},
    )
    AuditEvent.all_tenants.create(
        **old,
        action="project_quota.update",
        object_type="projectquota",
        object_repr=f"{world.project_a.pk}/{world.pool.pk}: 1..2",
        before={"pool": world.pool.pk, "project": world.project_a.pk, "limit": 2},
        after={"pool": world.pool.pk, "project": world.project_a.pk, "limit": 4},
    )
    AuditEvent.all_tenants.create(
        **old, action="membership.delete", object_type="membership", object_repr="999999@1:member"
    )
    page = _admin().get(AUDIT).content.decode()
    assert "member member_a" in page and "role: viewer → member" in page
    assert "project quota alpha in pool shared" in page and "GPU limit: 2 → 4" in page
    assert "member #999999" in page, "a user gone since is shown by id, not guessed"
    assert f"{world.member_a.pk}@{world.tenant_a.pk}" not in page


def test_filters_by_actor_subject_action_and_days(world: World) -> None:
    _history(world)
    with tenant_scope(world.tenant_a):
        membership = Membership.objects.get(user=world.member_a)
        services.update_member(actor=Actor(user=world.operator), membership=membership, role="viewer")
    admin = _admin()

    def subjects(**query: str) -> list[str]:
        page = admin.get(AUDIT, query).content.decode()
        return [cell.split("</td>")[0] for cell in page.split('<td class="subject">')[1:]]

    assert subjects(actor="operator") == ["member member_a"]
    assert set(subjects(actor="admin_a")) == {"invitation dan", "project quota alpha in pool shared"}
    assert subjects(actor="dan") == ["member dan"], "dan joined by answering the invitation"
    assert subjects(subject="dan") == ["member dan", "invitation dan"]
    assert subjects(action="project_quota.update") == ["project quota alpha in pool shared"]
    today = timezone.now().date()
    assert len(subjects(since=str(today), until=str(today))) == 5
    assert subjects(since=str(today + timedelta(days=1))) == []
    assert subjects(until=str(today - timedelta(days=1))) == []
    refused = admin.get(AUDIT, {"since": str(today), "until": str(today - timedelta(days=1))}).content.decode()
    assert "The last day must not be before the first." in refused and subjects(since="yesterday") == []


def test_csv_export_streams_the_filtered_rows(world: World) -> None:
    _history(world)
    response = _admin().get(f"{AUDIT}export.csv", {"actor": "admin_a", "action": "project_quota."})
    assert isinstance(response, StreamingHttpResponse)
    assert response["Content-Type"].startswith("text/csv")
    assert 'filename="audit-tenant-a.csv"' in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0] == ["time (UTC)", "actor", "token", "via", "action", "subject", "change", "request", "address"]
    assert [(r[1], r[4], r[5]) for r in rows[1:]] == [
        ("admin_a", "project_quota.update", "project quota alpha in pool shared"),
        ("admin_a", "project_quota.create", "project quota alpha in pool shared"),
    ]
    assert rows[1][6] == "guaranteed GPUs: 1 → 2; GPU limit: 2 → no limit"
    assert ProjectQuota.all_tenants.count() == 1


def test_members_and_outsiders_cannot_export(world: World) -> None:
    for username, status in (("member_a", 403), ("admin_b", 404)):
        client = Client()
        assert client.login(username=username, password=PASSWORD)
        assert client.get(f"{AUDIT}export.csv").status_code == status
