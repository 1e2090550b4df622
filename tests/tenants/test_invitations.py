"""Invitations name the projects the member joins, report every bad field at once, and lead to the tenant."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client

from tenants.models import AuditEvent, Membership
from tenants.scoping import tenant_scope
from tests.conftest import World, client_for

MEMBERS = "/api/v1/tenants/tenant-a/memberships/"
NEW_PASSWORD = "a brand new passphrase 42"


def test_an_invitation_puts_the_member_on_the_projects_it_names(world: World) -> None:
    response = client_for(world.admin_a).post(
        MEMBERS, {"username": "dan", "role": "member", "projects": ["alpha"]}, format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json()["projects"] == ["alpha"]
    with tenant_scope(world.tenant_a):
        assert [p.slug for p in Membership.objects.get(user__username="dan").projects.all()] == ["alpha"]
    event = AuditEvent.all_tenants.get(action="membership.create", object_id=str(response.json()["id"]))
    assert event.after is not None and event.after["projects"] == ["alpha"] and event.object_repr == "dan"


def test_every_bad_field_of_an_invitation_is_reported_at_once_and_nothing_is_written(world: World) -> None:
    before = (User.objects.count(), AuditEvent.all_tenants.count())
    response = client_for(world.admin_a).post(
        MEMBERS,
        {"username": "bad name!", "email": "not-an-address", "role": "boss", "projects": ["alpha", "beta", "nope"]},
        format="json",
    )
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert {name: errors[0]["code"] for name, errors in fields.items()} == {
        "username": "invalid",
        "email": "invalid",
        "role": "invalid_choice",
        "projects": "does_not_exist",
    }
    # Another tenant's project is as unknown here as one nobody made.
    assert "beta, nope" in fields["projects"][0]["message"]
    assert (User.objects.count(), AuditEvent.all_tenants.count()) == before


def test_inviting_a_member_twice_names_the_user_name(world: World) -> None:
    response = client_for(world.admin_a).post(MEMBERS, {"username": "member_a", "projects": ["x"]}, format="json")
    fields = response.json()["error"]["fields"]
    assert fields["username"][0]["code"] == "already_member" and fields["projects"][0]["code"] == "does_not_exist"


def _invite_link(world: World, username: str = "dan") -> str:
    response = client_for(world.admin_a).post(
        MEMBERS, {"username": username, "role": "member", "projects": ["alpha"]}, format="json"
    )
    return str(response.json()["setup_url"]).replace("http://testserver", "")


def test_the_invitation_page_names_user_tenant_role_and_projects_and_signs_in(world: World) -> None:
    link = _invite_link(world)
    person = Client()
    form_page = person.get(link, follow=True)
    text = form_page.content.decode()
    assert "You were invited to <strong>Tenant A</strong> as <strong>member</strong>" in text
    assert "<strong>Alpha</strong> (<code>alpha</code>)" in text
    assert "Your user name is <strong>dan</strong>" in text
    done = person.post(form_page.request["PATH_INFO"], {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert done.status_code == 302 and done["Location"] == "/"
    assert person.get("/")["Location"] == "/t/tenant-a/", "signed in, and on to their only tenant"


def test_a_used_link_leads_to_the_login_page_with_the_user_name(world: World) -> None:
    link = _invite_link(world)
    person = Client()
    form_page = person.get(link, follow=True)
    person.post(form_page.request["PATH_INFO"], {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    # Signed in as its owner, the link takes them home.
    assert person.get(link)["Location"] == "/"
    later = Client().get(link, follow=True)
    assert later.redirect_chain[-1][0] == "/login/?username=dan"
    assert 'value="dan"' in later.content.decode()


def test_a_forged_link_names_nobody(world: World) -> None:
    """The user name rides signed: a link made up from a user id tells nothing about the account."""
    link = _invite_link(world)
    uid = link.split("/")[2]
    for forged in (f"/invite/{uid}/made-up/", f"/invite/{uid}/made-up/?as=admin_a"):
        response = Client().get(forged)
        assert response.status_code == 200
        assert "This link no longer works" in response.content.decode()
        assert "dan" not in response.content.decode() and "admin_a" not in response.content.decode()
