"""Invitations: nobody joins a tenant without answering one, links work once and expire, and the inviter
learns nothing about accounts elsewhere. Every bad field is reported at once."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from tenants import services
from tenants.context import Actor
from tenants.models import AuditEvent, Invitation, Membership
from tenants.scoping import tenant_scope
from tests.conftest import PASSWORD, World, client_for

INVITES = "/api/v1/tenants/tenant-a/invitations/"
NEW_PASSWORD = "a brand new passphrase 42"


def _invite(inviter: User, username: str, tenant: str = "tenant-a", **fields: Any) -> dict[str, Any]:
    response = client_for(inviter).post(
        f"/api/v1/tenants/{tenant}/invitations/", {"username": username, **fields}, format="json"
    )
    assert response.status_code == 201, response.content
    return dict(response.json())


def _path(answer: dict[str, Any]) -> str:
    return str(answer["invite_url"]).replace("http://testserver", "")


def _secret(answer: dict[str, Any]) -> str:
    return _path(answer).rstrip("/").rsplit("/", 1)[-1]


def _signed_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def _is_member(username: str, tenant: Any) -> bool:
    return Membership.all_tenants.filter(tenant=tenant, user__username=username).exists()


def _invitation_part(response: Any) -> str:
    """The invitation itself on its page, without the one-time form token or the link's expiry minute."""
    text = response.content.decode()
    part = text[text.index('id="invitation"') : text.index("</article>")]
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"|until [0-9-]+ [0-9:]+ UTC|next=[^&]*', "", part)


def _create_account(link: str, client: Client | None = None) -> Any:
    return (client or Client()).post(link, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})


def test_an_invitation_adds_nobody_until_it_is_answered(world: World) -> None:
    answer = _invite(world.admin_a, "admin_b", role="viewer", projects=["alpha"])
    assert (answer["state"], answer["projects"]) == ("invited", ["alpha"])
    assert not _is_member("admin_b", world.tenant_a), "an existing account is not added by an admin's word"
    listed = client_for(world.admin_a).get(INVITES).json()["results"]
    assert [(i["username"], i["state"]) for i in listed] == [("admin_b", "invited")]
    event = AuditEvent.all_tenants.get(action="invitation.create")
    assert event.after is not None and event.after["projects"] == ["alpha"] and event.object_repr == "admin_b"


def test_the_answer_is_the_same_whether_or_not_the_user_name_exists_anywhere(world: World) -> None:
    existing = _invite(world.admin_a, "admin_b", email="b@tenant-a.example")
    new = _invite(world.admin_a, "newbie", email="n@tenant-a.example")
    assert existing.keys() == new.keys()
    assert "/invite/" in existing["invite_url"] and "/invite/" in new["invite_url"]
    same = {"role", "projects", "state", "answered_at"}
    assert {k: existing[k] for k in same} == {k: new[k] for k in same}
    assert not User.objects.filter(username="newbie").exists(), "no account until its owner makes it"
    # Opening the links (the inviter has them) tells nothing either: the same page but for the name.
    pages = [_invitation_part(Client().get(_path(a))) for a in (existing, new)]
    assert pages[0].replace("admin_b", "X") == pages[1].replace("newbie", "X")
    assert "Choose a password" in pages[0]


def test_a_stale_link_of_another_tenant_cannot_take_over_an_invitation(world: World) -> None:
    """The squat of issue 32: tenant B's admin keeps a link for a new name, then tenant A invites that name."""
    b_link = _path(_invite(world.admin_b, "carol", tenant="tenant-b"))
    a_answer = _invite(world.admin_a, "carol", projects=["alpha"])
    squatter = Client()
    assert _create_account(b_link, squatter).status_code == 302, "B's link makes the account, in B only"
    assert _is_member("carol", world.tenant_b) and not _is_member("carol", world.tenant_a)
    # Signed in as carol, the squatter sees A's invitation but cannot accept it without A's link.
    mine = squatter.get("/api/v1/invitations/").json()["results"]
    assert [i["tenant"] for i in mine] == ["tenant-a"]
    refused = squatter.post("/api/v1/invitations/accept/", {"secret": "guessed"}, content_type="application/json")
    assert refused.status_code == 400 and refused.json()["error"]["fields"]["secret"][0]["code"] == "gone"
    assert Client().get(b_link).status_code == 410, "B's link worked once"
    # The person A meant opens A's link: the name is taken, so they cannot become carol either.
    real = _create_account(_path(a_answer))
    assert "sign in as carol" in real.content.decode()
    assert not _is_member("carol", world.tenant_a)
    assert Invitation.all_tenants.get(tenant=world.tenant_a).state == "invited"


def test_an_existing_account_joins_once_its_owner_accepts_signed_in(world: World) -> None:
    link = _path(_invite(world.admin_a, "admin_b", role="member", projects=["alpha"]))
    home = _signed_in(world.admin_b).get("/")
    assert home.status_code == 200, "an invitation waiting keeps them on the home page"
    waiting = home.content.decode().split('id="my-invitations"')[1].split("</section>")[0]
    assert "Tenant A (<code>tenant-a</code>) invited you as member, on <code>alpha</code>" in waiting
    anonymous = Client().get(link).content.decode()
    assert "Log in</a> to accept" in anonymous
    owner = _signed_in(world.admin_b)
    page = _invitation_part(owner.get(link))
    assert "Accept and join Tenant A" in page
    assert "Tenant B" not in page and "tenant-b" not in page, "the invitation shows the inviting tenant only"
    accepted = owner.post(link, {"accept": "1"})
    assert accepted.status_code == 302 and accepted["Location"] == "/t/tenant-a/"
    with tenant_scope(world.tenant_a):
        membership = Membership.objects.get(user=world.admin_b)
        assert (membership.role, [p.slug for p in membership.projects.all()]) == ("member", ["alpha"])
    assert owner.get(link).status_code == 410, "a link works once"
    assert client_for(world.admin_a).get(INVITES).json()["results"][0]["state"] == "accepted"


def test_another_account_cannot_answer_and_a_token_cannot_accept(world: World) -> None:
    answer = _invite(world.admin_a, "admin_b")
    stranger = _signed_in(world.member_a)
    assert "You are signed in as member_a" in stranger.get(_path(answer)).content.decode()
    stranger.post(_path(answer), {"accept": "1"})
    token = services.create_token(
        actor=Actor(user=world.admin_b), tenant=world.tenant_b, name="t", role="admin", expires_in_days=1
    )
    bearer = APIClient()
    bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {token.secret}")
    refused = bearer.post("/api/v1/invitations/accept/", {"secret": _secret(answer)}, format="json")
    assert refused.status_code == 403
    assert not _is_member("admin_b", world.tenant_a) and not _is_member("member_a", world.tenant_b)
    accepted = _signed_in(world.admin_b).post(
        "/api/v1/invitations/accept/", {"secret": _secret(answer)}, content_type="application/json"
    )
    assert accepted.status_code == 201 and accepted.json()["tenant"] == "tenant-a"


def test_a_declined_invitation_adds_nobody_and_the_inviter_sees_it(world: World) -> None:
    answer = _invite(world.admin_a, "admin_b")
    declined = _signed_in(world.admin_b).post(
        "/api/v1/invitations/decline/", {"secret": _secret(answer)}, content_type="application/json"
    )
    assert declined.status_code == 204
    assert not _is_member("admin_b", world.tenant_a)
    assert client_for(world.admin_a).get(INVITES).json()["results"][0]["state"] == "declined"
    assert _invite(world.admin_a, "admin_b")["state"] == "invited", "a new invitation can follow"


def test_a_new_person_makes_their_account_through_the_link_once(world: World) -> None:
    link = _path(_invite(world.admin_a, "dan", role="member", projects=["alpha"]))
    person = Client()
    text = person.get(link).content.decode()
    assert "You were invited to <strong>Tenant A</strong> as <strong>member</strong>" in text
    assert "<strong>Alpha</strong> (<code>alpha</code>)" in text
    done = _create_account(link, person)
    assert done.status_code == 302 and done["Location"] == "/t/tenant-a/"
    assert person.get("/")["Location"] == "/t/tenant-a/", "signed in, on their tenant"
    assert User.objects.get(username="dan").has_usable_password()
    assert Client().get(link).status_code == 410
    assert _create_account(link).status_code == 410, "the used link sets no password again"


def test_an_expired_or_withdrawn_link_does_nothing(world: World, settings: Any) -> None:
    settings.INVITATION_TTL_HOURS = 1
    expired = _invite(world.admin_a, "dan")
    Invitation.all_tenants.filter(username="dan").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert Client().get(_path(expired)).status_code == 410
    assert _create_account(_path(expired)).status_code == 410
    assert not User.objects.filter(username="dan").exists()
    again = _invite(world.admin_a, "dan")  # an expired invitation makes way for a new one
    assert timezone.now() + timedelta(minutes=59) < Invitation.all_tenants.get(pk=again["id"]).expires_at
    withdrawn = client_for(world.admin_a).delete(f"{INVITES}{again['id']}/")
    assert withdrawn.status_code == 200 and withdrawn.json()["state"] == "revoked"
    assert Client().get(_path(again)).status_code == 410


def test_a_forged_link_names_nobody(world: World) -> None:
    _invite(world.admin_a, "dan")
    response = Client().get("/invite/made-up-secret/")
    assert response.status_code == 410
    assert "This link no longer works" in response.content.decode() and "dan" not in response.content.decode()


def test_every_bad_field_of_an_invitation_is_reported_at_once_and_nothing_is_written(world: World) -> None:
    before = (User.objects.count(), Invitation.all_tenants.count(), AuditEvent.all_tenants.count())
    response = client_for(world.admin_a).post(
        INVITES,
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
    assert (User.objects.count(), Invitation.all_tenants.count(), AuditEvent.all_tenants.count()) == before


def test_inviting_a_member_or_someone_invited_names_the_user_name(world: World) -> None:
    response = client_for(world.admin_a).post(INVITES, {"username": "member_a", "projects": ["x"]}, format="json")
    fields = response.json()["error"]["fields"]
    assert fields["username"][0]["code"] == "already_member" and fields["projects"][0]["code"] == "does_not_exist"
    _invite(world.admin_a, "dan")
    twice = client_for(world.admin_a).post(INVITES, {"username": "dan"}, format="json")
    assert twice.json()["error"]["fields"]["username"][0]["code"] == "already_invited"


def test_members_cannot_invite_nor_see_invitations_and_other_tenants_answer_404(world: World) -> None:
    assert client_for(world.member_a).post(INVITES, {"username": "pal"}, format="json").status_code == 403
    assert client_for(world.member_a).get(INVITES).status_code == 403
    assert client_for(world.admin_b).post(INVITES, {"username": "pal"}, format="json").status_code == 404
    answer = _invite(world.admin_a, "dan")
    assert client_for(world.admin_b).delete(f"/api/v1/tenants/tenant-b/invitations/{answer['id']}/").status_code == 404
    assert (
        client_for(world.admin_a)
        .post("/api/v1/tenants/tenant-a/memberships/", {"username": "pal"}, format="json")
        .status_code
        == 405
    ), "members join by invitation only"
