"""API tokens: shown once, stored as a digest, bounded by the owner's role, revoked or expired at once."""

from __future__ import annotations

import hashlib
from datetime import timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from tenants import services
from tenants.context import Actor
from tenants.models import ApiToken, Membership
from tests.conftest import World, client_for

PROJECTS = "/api/v1/tenants/tenant-a/projects/"


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def issue(world: World, user: str = "admin_a", role: str = "admin") -> services.IssuedToken:
    owner = getattr(world, user)
    tenant = world.tenant_b if user == "admin_b" else world.tenant_a
    return services.create_token(actor=Actor(user=owner), tenant=tenant, name="t", role=role, expires_in_days=30)


def test_secret_is_shown_once_and_only_its_digest_is_stored(world: World) -> None:
    response = client_for(world.member_a).post(
        "/api/v1/tokens/", {"name": "ci", "tenant": "tenant-a", "role": "member"}, format="json"
    )
    assert response.status_code == 201
    secret = response.json()["secret"]
    token = ApiToken.all_tenants.get(pk=response.json()["id"])
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in str(ApiToken.all_tenants.filter(pk=token.pk).values().first())
    listed = client_for(world.member_a).get("/api/v1/tokens/").content.decode()
    detail = client_for(world.member_a).get(f"/api/v1/tokens/{token.pk}/").content.decode()
    assert secret not in listed and secret not in detail and "secret" not in detail
    assert bearer(secret).get(PROJECTS).status_code == 200


def test_role_above_the_owners_is_refused(world: World) -> None:
    response = client_for(world.member_a).post(
        "/api/v1/tokens/", {"name": "x", "tenant": "tenant-a", "role": "admin"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["role"][0]["code"] == "above_own_role"
    assert not ApiToken.all_tenants.exists()


def test_only_operators_mint_operator_tokens(world: World) -> None:
    refused = client_for(world.admin_a).post("/api/v1/tokens/", {"name": "x", "role": "operator"}, format="json")
    assert refused.status_code == 403
    made = client_for(world.operator).post("/api/v1/tokens/", {"name": "ops", "role": "operator"}, format="json")
    assert made.status_code == 201 and made.json()["tenant"] is None
    assert (
        bearer(made.json()["secret"]).post("/api/v1/node-pools/", {"name": "gpu-a"}, format="json").status_code == 201
    )


def test_tokens_in_a_url_do_not_authenticate(world: World) -> None:
    secret = issue(world).secret
    for query in (f"?token={secret}", f"?access_token={secret}", f"?auth={secret}"):
        assert APIClient().get(PROJECTS + query).status_code == 401


def test_revocation_takes_effect_on_the_next_request(world: World) -> None:
    issued = issue(world)
    client = bearer(issued.secret)
    assert client.get(PROJECTS).status_code == 200
    services.revoke_token(actor=Actor(user=world.admin_a), token=issued.token)
    response = client.get(PROJECTS)
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]["message"]


def test_expired_token_is_refused(world: World) -> None:
    issued = issue(world)
    ApiToken.all_tenants.filter(pk=issued.token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert bearer(issued.secret).get(PROJECTS).status_code == 401


def test_malformed_and_unknown_tokens_are_refused(world: World) -> None:
    secret = issue(world).secret
    for bad in ("gpc_nothing", secret[:-2] + "xx", "gpc_ffffffffffff_abc", "Bearer"):
        assert bearer(bad).get(PROJECTS).status_code == 401


def test_token_reaches_only_its_own_tenant(world: World) -> None:
    secret = issue(world).secret
    assert bearer(secret).get("/api/v1/tenants/tenant-b/projects/").status_code == 404
    me = bearer(secret).get("/api/v1/me/").json()
    assert [m["tenant"] for m in me["memberships"]] == ["tenant-a"]
    assert me["token"]["role"] == "admin"


def test_removed_member_loses_their_tokens(world: World) -> None:
    issued = issue(world, "member_a", "member")
    Membership.all_tenants.filter(user=world.member_a).delete()
    assert bearer(issued.secret).get(PROJECTS).status_code == 401


def test_deactivated_owner_loses_their_tokens(world: World) -> None:
    issued = issue(world)
    world.admin_a.is_active = False
    world.admin_a.save()
    assert bearer(issued.secret).get(PROJECTS).status_code == 401


def test_token_role_caps_the_owners_rights(world: World) -> None:
    viewer_token = issue(world, "admin_a", "viewer")
    response = bearer(viewer_token.secret).post(PROJECTS, {"slug": "nope", "name": "Nope"}, format="json")
    assert response.status_code == 403


def test_token_cannot_mint_a_stronger_token(world: World) -> None:
    member_token = issue(world, "admin_a", "member")
    response = bearer(member_token.secret).post(
        "/api/v1/tokens/", {"name": "up", "tenant": "tenant-a", "role": "admin"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["role"][0]["code"] == "above_own_role"


def test_role_is_reduced_when_the_owner_is_demoted(world: World) -> None:
    issued = issue(world, "admin_a", "admin")
    Membership.all_tenants.filter(user=world.admin_a).update(role="viewer")
    assert bearer(issued.secret).post(PROJECTS, {"slug": "x", "name": "X"}, format="json").status_code == 403


def test_last_used_is_recorded(world: World) -> None:
    issued = issue(world)
    assert issued.token.last_used_at is None
    bearer(issued.secret).get(PROJECTS)
    assert ApiToken.all_tenants.get(pk=issued.token.pk).last_used_at is not None


def test_tenant_admin_revokes_a_members_token_and_a_member_cannot(world: World) -> None:
    issued = issue(world, "member_a", "member")
    url = f"/api/v1/tenants/tenant-a/tokens/{issued.token.pk}/"
    assert client_for(world.member_a).delete(url).status_code == 403
    assert client_for(world.viewer_a).delete(url).status_code == 403
    response = client_for(world.admin_a).delete(url)
    assert response.status_code == 200 and response.json()["revoked_at"]
    assert bearer(issued.secret).get(PROJECTS).status_code == 401


def test_lifetime_is_bounded(world: World, settings) -> None:
    for days in (0, settings.API_TOKEN_MAX_DAYS + 1):
        response = client_for(world.admin_a).post(
            "/api/v1/tokens/",
            {"name": "x", "tenant": "tenant-a", "role": "viewer", "expires_in_days": days},
            format="json",
        )
        assert response.status_code == 400
        assert "expires_in_days" in response.json()["error"]["fields"]
