"""Memberships: invitations, role bounds, the last admin, project assignment."""

from __future__ import annotations

from django.contrib.auth.models import User

from tenants.models import Membership
from tenants.scoping import tenant_scope
from tests.conftest import World, client_for

MEMBERS = "/api/v1/tenants/tenant-a/memberships/"


def _membership(user: User) -> Membership:
    return Membership.all_tenants.get(user=user)


def test_inviting_a_new_person_creates_the_account_and_a_one_time_link(world: World) -> None:
    response = client_for(world.admin_a).post(
        MEMBERS, {"username": "newbie", "email": "newbie@example.com", "role": "member"}, format="json"
    )
    assert response.status_code == 201
    assert "/invite/" in response.json()["setup_url"]
    newbie = User.objects.get(username="newbie")
    assert not newbie.has_usable_password(), "nobody can log in as an invited account before its owner sets a password"


def test_inviting_an_existing_user_gives_no_link(world: World) -> None:
    response = client_for(world.admin_a).post(MEMBERS, {"username": "admin_b", "role": "viewer"}, format="json")
    assert response.status_code == 201
    assert response.json()["setup_url"] is None


def test_duplicate_membership_is_refused(world: World) -> None:
    response = client_for(world.admin_a).post(MEMBERS, {"username": "member_a"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["username"][0]["code"] == "already_member"


def test_tenant_admin_cannot_make_anyone_an_operator(world: World) -> None:
    invite = client_for(world.admin_a).post(MEMBERS, {"username": "x", "role": "operator"}, format="json")
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
        client_for(world.admin_a).post("/api/v1/tenants/tenant-b/memberships/", {"username": "admin_a"}).status_code
        == 404
    )
    assert _membership(world.admin_b).role == "admin"


def test_member_cannot_invite_or_change_roles(world: World) -> None:
    assert client_for(world.member_a).post(MEMBERS, {"username": "pal"}, format="json").status_code == 403
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
    response = client_for(world.admin_a).post(MEMBERS, {"username": "bad name!", "role": "viewer"}, format="json")
    assert response.status_code == 400
    assert "username" in response.json()["error"]["fields"]
    assert not User.objects.filter(username="bad name!").exists()
