"""Memberships: what joining reveals, role bounds, the last admin, project assignment."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.test import Client

from tenants.models import Membership
from tenants.scoping import tenant_scope
from tests.conftest import PASSWORD, World, client_for

MEMBERS = "/api/v1/tenants/tenant-a/memberships/"
INVITES = "/api/v1/tenants/tenant-a/invitations/"


def logged_in_page(user: User, path: str) -> Any:
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client.get(path)


def _membership(user: User) -> Membership:
    return Membership.all_tenants.get(user=user)


def _membership_in(user: User, tenant: Any) -> Membership:
    return Membership.all_tenants.get(user=user, tenant=tenant)


def _accepted(world: World, username: str, **fields: Any) -> dict[str, Any]:
    """Invite `username` (an existing account) to tenant A and accept as its owner; return the invitation."""
    answer = client_for(world.admin_a).post(INVITES, {"username": username, **fields}, format="json")
    assert answer.status_code == 201, answer.content
    owner = Client()
    assert owner.login(username=username, password=PASSWORD)
    assert owner.post(answer.json()["invite_url"].replace("http://testserver", ""), {"accept": "1"}).status_code == 302
    return dict(answer.json())


def _private(user: User) -> list[str]:
    """Give `user` a name, and return what of them no other tenant may learn: e-mail address and name."""
    user.first_name, user.last_name = "Beatrix", "Outside"
    user.save()
    return [user.email, user.first_name, user.last_name]


def test_inviting_another_tenants_user_by_name_reveals_nothing_about_them(world: World) -> None:
    private = _private(world.admin_b)
    admin = client_for(world.admin_a)
    invited = admin.post(INVITES, {"username": "admin_b", "role": "viewer"}, format="json")
    assert invited.status_code == 201
    before = [invited, admin.get(INVITES), admin.get(f"{INVITES}{invited.json()['id']}/")]
    owner = Client()
    assert owner.login(username="admin_b", password=PASSWORD)
    owner.post(invited.json()["invite_url"].replace("http://testserver", ""), {"accept": "1"})
    pk = _membership_in(world.admin_b, world.tenant_a).pk
    answers = [
        *before,
        admin.get(MEMBERS),
        admin.get(f"{MEMBERS}{pk}/"),
        admin.patch(f"{MEMBERS}{pk}/", {"role": "member"}, format="json"),
        admin.get("/api/v1/tenants/tenant-a/audit-events/"),
        logged_in_page(world.admin_a, "/t/tenant-a/members/"),
    ]
    for answer in answers:
        assert answer.status_code in (200, 201)
        assert not [word for word in private if word in answer.content.decode()], answer.request["PATH_INFO"]
    assert invited.json()["email"] == ""
    # Searching by the address finds nobody: it is not the tenant's to match.
    assert admin.get(MEMBERS, {"search": world.admin_b.email}).json()["count"] == 0


def test_the_address_an_admin_gives_is_the_tenants_own_and_changes_no_account(world: World) -> None:
    admin = client_for(world.admin_a)
    assert _accepted(world, "admin_b", email="bea@tenant-a.example")["email"] == "bea@tenant-a.example"
    assert User.objects.get(username="admin_b").email == "admin_b@example.com", "the account keeps its own"
    assert admin.get(MEMBERS, {"search": "bea@tenant-a"}).json()["count"] == 1
    created = admin.post(INVITES, {"username": "newbie", "email": "newbie@tenant-a.example"}, format="json")
    link = created.json()["invite_url"].replace("http://testserver", "")
    Client().post(link, {"new_password1": "a brand new passphrase 42", "new_password2": "a brand new passphrase 42"})
    assert User.objects.get(username="newbie").email == "newbie@tenant-a.example"
    # Tenant B, where admin_b is admin, sees the address B gave (none: admin_b was not invited there).
    assert client_for(world.admin_b).get("/api/v1/tenants/tenant-b/memberships/").json()["results"][0]["email"] == ""


def test_duplicate_membership_is_refused(world: World) -> None:
    response = client_for(world.admin_a).post(INVITES, {"username": "member_a"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["username"][0]["code"] == "already_member"


def test_tenant_admin_cannot_make_anyone_an_operator(world: World) -> None:
    invite = client_for(world.admin_a).post(INVITES, {"username": "x", "role": "operator"}, format="json")
    assert invite.status_code == 400
    assert invite.json()["error"]["fields"]["role"][0]["code"] == "invalid_choice"
    url = f"{MEMBERS}{_membership(world.member_a).pk}/"
    change = client_for(world.admin_a).patch(url, {"role": "operator"}, format="json")
    assert change.status_code == 400
    assert not User.objects.get(username="member_a").is_staff


def test_tenant_admin_cannot_act_in_another_tenant(world: World) -> None:
    url = f"/api/v1/tenants/tenant-b/memberships/{_membership(world.admin_b).pk}/"
    assert client_for(world.admin_a).patch(url, {"role": "viewer"}, format="json").status_code == 404
    assert (
        client_for(world.admin_a).post("/api/v1/tenants/tenant-b/invitations/", {"username": "admin_a"}).status_code
        == 404
    )
    assert _membership(world.admin_b).role == "admin"


def test_member_cannot_invite_or_change_roles(world: World) -> None:
    assert client_for(world.member_a).post(INVITES, {"username": "pal"}, format="json").status_code == 403
    url = f"{MEMBERS}{_membership(world.member_a).pk}/"
    assert client_for(world.member_a).patch(url, {"role": "admin"}, format="json").status_code == 403
    assert _membership(world.member_a).role == "member"


def test_the_last_admin_cannot_be_demoted_or_removed_except_by_an_operator(world: World) -> None:
    url = f"{MEMBERS}{_membership(world.admin_a).pk}/"
    demote = client_for(world.admin_a).patch(url, {"role": "member"}, format="json")
    assert demote.status_code == 409
    assert demote.json()["error"]["code"] == "last_admin"
    assert client_for(world.admin_a).delete(url).status_code == 409
    assert client_for(world.operator).patch(url, {"role": "member"}, format="json").status_code == 200


def test_a_second_admin_makes_demotion_possible(world: World) -> None:
    promote = client_for(world.admin_a).patch(
        f"{MEMBERS}{_membership(world.member_a).pk}/", {"role": "admin"}, format="json"
    )
    assert promote.status_code == 200
    assert (
        client_for(world.admin_a)
        .patch(f"{MEMBERS}{_membership(world.admin_a).pk}/", {"role": "viewer"}, format="json")
        .status_code
        == 200
    )


def test_projects_are_assigned_from_the_tenant_only(world: World) -> None:
    url = f"{MEMBERS}{_membership(world.member_a).pk}/"
    ok = client_for(world.admin_a).patch(url, {"projects": ["alpha"]}, format="json")
    assert ok.status_code == 200 and ok.json()["projects"] == ["alpha"]
    foreign = client_for(world.admin_a).patch(url, {"projects": ["beta"]}, format="json")
    assert foreign.status_code == 400
    assert foreign.json()["error"]["fields"]["projects"][0]["code"] == "does_not_exist"
    with tenant_scope(world.tenant_a):
        assert [p.slug for p in _membership(world.member_a).projects.all()] == ["alpha"]


def test_malformed_invitations_name_the_field(world: World) -> None:
    response = client_for(world.admin_a).post(INVITES, {"username": "bad name!", "role": "viewer"}, format="json")
    assert response.status_code == 400
    assert "username" in response.json()["error"]["fields"]
    assert not User.objects.filter(username="bad name!").exists()
