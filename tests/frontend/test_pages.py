"""The console's pages through Django's test client: access, admin actions, service errors, one-time secrets."""

from __future__ import annotations

import pytest
from django.test import Client

from tenants.models import ApiToken, AuditEvent, Membership, Project, ProjectQuota, Tenant, TenantQuota
from tests.conftest import PASSWORD, World

TENANT_PAGES = ["", "projects/", "members/", "quotas/", "tokens/", "audit/", "projects/alpha/", "queue/"]


def logged_in(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=PASSWORD)
    return client


@pytest.mark.parametrize("suffix", TENANT_PAGES)
def test_anonymous_visitors_are_sent_to_log_in(world: World, suffix: str) -> None:
    response = Client().get(f"/t/tenant-a/{suffix}")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


@pytest.mark.parametrize("suffix", TENANT_PAGES)
def test_outsiders_get_not_found_on_every_tenant_page(world: World, suffix: str) -> None:
    assert logged_in("admin_b").get(f"/t/tenant-a/{suffix}").status_code == 404


@pytest.mark.parametrize("path", ["/ops/tenants/", "/ops/pools/"])
def test_operator_pages_do_not_exist_for_tenant_admins(world: World, path: str) -> None:
    assert logged_in("admin_a").get(path).status_code == 404
    assert logged_in("operator").get(path).status_code == 200


@pytest.mark.parametrize("username", ["member_a", "viewer_a"])
def test_members_and_viewers_see_no_admin_actions(world: World, username: str) -> None:
    client = logged_in(username)
    pages = {
        suffix: client.get(f"/t/tenant-a/{suffix}").content.decode() for suffix in ("projects/", "members/", "quotas/")
    }
    assert 'id="create-project"' not in pages["projects/"]
    assert "/projects/alpha/" not in pages["projects/"]
    assert 'id="invite"' not in pages["members/"]
    assert "row-edit" not in pages["members/"]
    assert 'id="add-project-quota"' not in pages["quotas/"]
    assert "edit-row" not in pages["quotas/"]
    assert client.get("/t/tenant-a/audit/").status_code == 403


def test_members_cannot_post_admin_actions_either(world: World) -> None:
    client = logged_in("member_a")
    response = client.post("/t/tenant-a/projects/", {"new-slug": "sneaky", "new-name": "Sneaky"})
    assert response.status_code == 403
    assert not Project.all_tenants.filter(slug="sneaky").exists()


def test_admin_creates_a_project_with_exactly_one_audit_event(world: World) -> None:
    before = AuditEvent.all_tenants.count()
    response = logged_in("admin_a").post("/t/tenant-a/projects/", {"new-slug": "gamma", "new-name": "Gamma"})
    assert response.status_code == 302
    assert Project.all_tenants.filter(tenant=world.tenant_a, slug="gamma").exists()
    events = list(AuditEvent.all_tenants.filter(pk__gt=before).values_list("action", "via", "tenant_id"))
    assert AuditEvent.all_tenants.count() == before + 1
    assert events[-1] == ("project.create", "ui", world.tenant_a.pk)


def test_impossible_project_quota_shows_the_rule_on_its_field_and_writes_nothing(world: World) -> None:
    before = AuditEvent.all_tenants.count()
    response = logged_in("admin_a").post(
        "/t/tenant-a/quotas/",
        {
            "action": "project-quota",
            "pq-project": "alpha",
            "pq-pool": "shared",
            "pq-guaranteed": 12,
            "pq-limit": 17,
            "pq-weight": 1,
        },
    )
    assert response.status_code == 200
    assert 'data-field="limit"' in response.content.decode()
    assert "exceeds the tenant&#x27;s limit of 16 GPUs" in response.content.decode()
    assert not ProjectQuota.all_tenants.exists()
    assert AuditEvent.all_tenants.count() == before


def test_invitation_link_is_shown_once_and_lets_the_new_member_set_a_password(world: World) -> None:
    admin = logged_in("admin_a")
    admin.post("/t/tenant-a/members/", {"invite-username": "newbie", "invite-role": "viewer"})
    page = admin.get("/t/tenant-a/members/").content.decode()
    link = page.split('id="invite-link"')[1].split('value="')[1].split('"')[0]
    assert "/invite/" in link
    again = admin.get("/t/tenant-a/members/").content.decode()
    assert "/invite/" not in again, "the link is shown once"
    assert "newbie" in again.split('id="invitations"')[1] and "invited, link valid until" in again
    newbie = Client()
    password = "a brand new passphrase 42"
    path = link.replace("http://testserver", "")
    response = newbie.post(path, {"new_password1": password, "new_password2": password})
    assert response.status_code == 302
    assert newbie.login(username="newbie", password=password)
    assert AuditEvent.all_tenants.filter(action="membership.create", actor_label="newbie").count() == 1
    assert 'id="invitations"' not in admin.get("/t/tenant-a/members/").content.decode(), "answered: a member now"


def test_token_secret_is_shown_once(world: World) -> None:
    client = logged_in("member_a")
    client.post("/t/tenant-a/tokens/", {"name": "laptop", "role": "member", "expires_in_days": 7})
    first = client.get("/t/tenant-a/tokens/").content.decode()
    secret = first.split('id="token-secret"')[0].rsplit('value="', 1)[1].split('"')[0]
    token = ApiToken.all_tenants.get(name="laptop")
    assert secret.startswith(f"gpc_{token.prefix}_")
    assert secret not in client.get("/t/tenant-a/tokens/").content.decode()


def test_member_cannot_mint_a_token_above_their_role(world: World) -> None:
    response = logged_in("member_a").post("/t/tenant-a/tokens/", {"name": "x", "role": "admin", "expires_in_days": 7})
    assert response.status_code == 200
    assert not ApiToken.all_tenants.exists()


def test_login_locks_after_repeated_failures_even_for_the_right_password(world: World, settings) -> None:
    settings.AXES_ENABLED = True
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/login/", {"username": "member_a", "password": "wrong"})
    response = client.post("/login/", {"username": "member_a", "password": PASSWORD})
    assert response.status_code == 200
    assert "Too many failed attempts" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_outsiders_cannot_post_to_another_tenants_write_pages(world: World) -> None:
    """Write URLs answer an outsider exactly like read URLs: 404, and nothing changes."""
    membership = Membership.all_tenants.get(user=world.member_a, tenant=world.tenant_a)
    client = logged_in("admin_b")
    before = AuditEvent.all_tenants.count()
    posts = {
        "/t/tenant-a/projects/": {"new-slug": "sneaky", "new-name": "Sneaky"},
        "/t/tenant-a/projects/alpha/": {"delete": "1"},
        f"/t/tenant-a/members/{membership.pk}/": {"remove": "1"},
        "/t/tenant-a/members/": {"invite-username": "mole", "invite-role": "admin"},
        f"/t/tenant-a/quotas/tq/{world.quota_a.pk}/": {"delete": "1"},
        "/t/tenant-a/tokens/": {"name": "x", "role": "viewer", "expires_in_days": 7},
    }
    for path, data in posts.items():
        assert client.post(path, data).status_code == 404, path
    assert AuditEvent.all_tenants.count() == before


def test_quota_edit_urls_name_a_known_kind_of_quota(world: World) -> None:
    response = logged_in("admin_a").post(f"/t/tenant-a/quotas/zz/{world.quota_a.pk}/", {"delete": "1"})
    assert response.status_code == 404


def test_only_operators_change_tenant_quotas_even_by_posting(world: World) -> None:
    response = logged_in("admin_a").post(f"/t/tenant-a/quotas/tq/{world.quota_a.pk}/", {"delete": "1"})
    assert response.status_code == 403
    assert TenantQuota.all_tenants.filter(pk=world.quota_a.pk).exists()


def test_operators_create_tenants_from_the_home_page(world: World) -> None:
    client = logged_in("operator")
    assert 'id="create-tenant"' in client.get("/").content.decode()
    response = client.post("/ops/tenants/", {"create": "1", "slug": "tenant-c", "name": "Tenant C"})
    assert response.status_code == 302
    assert Tenant.objects.filter(slug="tenant-c").exists()


def test_a_member_of_one_tenant_lands_on_it_and_sees_no_tenant_creation(world: World) -> None:
    client = logged_in("member_a")
    assert client.get("/")["Location"] == "/t/tenant-a/"
    assert 'id="create-tenant"' not in client.get("/t/tenant-a/").content.decode()
