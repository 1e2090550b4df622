"""API tokens: shown once, stored as a digest, bounded by the owner's role, revoked or expired at once."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import Http404
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from tenants import services
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import ApiToken, Membership, Tenant
from tenants.services.tokens import (
    TokenRejected,
    authenticate_secret,
    authenticate_secrets,
    reload_token,
    token_membership_role,
)
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


def test_a_token_minted_by_a_short_token_expires_with_it_and_dies_when_it_is_revoked(world: World) -> None:
    short = services.create_token(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, name="one day", role="admin", expires_in_days=1
    )
    response = bearer(short.secret).post(
        "/api/v1/tokens/", {"name": "long", "tenant": "tenant-a", "expires_in_days": 90}, format="json"
    )
    assert response.status_code == 201, response.json()
    child = ApiToken.all_tenants.get(prefix=response.json()["prefix"])
    grandchild_secret = (
        bearer(response.json()["secret"])
        .post("/api/v1/tokens/", {"name": "longer", "tenant": "tenant-a", "expires_in_days": 90}, format="json")
        .json()["secret"]
    )
    assert child.expires_at <= short.token.expires_at
    assert bearer(grandchild_secret).get(PROJECTS).status_code == 200
    services.revoke_token(actor=Actor(user=world.admin_a), token=short.token)
    for secret in (response.json()["secret"], grandchild_secret):
        refused = bearer(secret).get(PROJECTS)
        assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]


def test_a_token_minted_in_the_console_keeps_the_lifetime_asked_for(world: World) -> None:
    issued = services.create_token(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, name="long", role="admin", expires_in_days=90
    )
    assert issued.token.parent is None
    assert issued.token.expires_at > timezone.now() + timedelta(days=89)


def test_role_is_reduced_when_the_owner_is_demoted(world: World) -> None:
    issued = issue(world, "admin_a", "admin")
    Membership.all_tenants.filter(user=world.admin_a).update(role="viewer")
    assert bearer(issued.secret).post(PROJECTS, {"slug": "x", "name": "X"}, format="json").status_code == 403


def test_last_used_is_recorded(world: World) -> None:
    issued = issue(world)
    assert issued.token.last_used_at is None
    bearer(issued.secret).get(PROJECTS)
    assert ApiToken.all_tenants.get(pk=issued.token.pk).last_used_at is not None


def test_a_deactivated_tenant_refuses_its_tokens_everywhere_at_once(world: World) -> None:
    issued = issue(world, "member_a", "member")
    assert bearer(issued.secret).get("/api/v1/me/").status_code == 200
    services.update_tenant(actor=Actor(user=world.operator), tenant=world.tenant_a, is_active=False)
    for url in (PROJECTS, "/api/v1/me/", "/api/v1/tokens/", "/api/v1/node-pools/", "/api/v1/tenants/"):
        response = bearer(issued.secret).get(url)
        assert response.status_code == 401, url
        assert response.json()["error"]["message"] == "The token's tenant is deactivated."
    services.update_tenant(actor=Actor(user=world.operator), tenant=world.tenant_a, is_active=True)
    assert bearer(issued.secret).get(PROJECTS).status_code == 200


# The token rule: a token never manages a token of another tenant, nor one more powerful than itself.


def dual_world(world: World) -> dict[str, services.IssuedToken]:
    """admin_b is also a member of tenant A; their tokens: admin in B, member and viewer in A, and an
    admin token in A from the time they were an admin there."""
    membership = Membership.all_tenants.create(tenant=world.tenant_a, user=world.admin_b, role="admin")
    owner = Actor(user=world.admin_b)
    tokens = {
        name: services.create_token(actor=owner, tenant=tenant, name=name, role=role, expires_in_days=1)
        for name, tenant, role in (
            ("b-admin", world.tenant_b, "admin"),
            ("a-admin", world.tenant_a, "admin"),
            ("a-member", world.tenant_a, "member"),
            ("a-viewer", world.tenant_a, "viewer"),
        )
    }
    Membership.all_tenants.filter(pk=membership.pk).update(role="member")
    return tokens


def listed(secret: str) -> set[str]:
    response = bearer(secret).get("/api/v1/tokens/")
    assert response.status_code == 200, response.content
    return {row["name"] for row in response.json()["results"]}


def test_a_token_lists_reads_and_revokes_only_its_owners_tokens_of_its_own_tenant(world: World) -> None:
    tokens = dual_world(world)
    b_admin, a_member = tokens["b-admin"], tokens["a-member"]
    assert listed(b_admin.secret) == {"b-admin"}
    assert listed(a_member.secret) == {"a-member", "a-viewer"}
    for token in (tokens["a-admin"], a_member, tokens["a-viewer"]):
        url = f"/api/v1/tokens/{token.token.pk}/"
        for method in ("get", "delete"):
            response = getattr(bearer(b_admin.secret), method)(url)
            assert response.status_code == 404, (method, token.token.name)
            assert response.json()["error"]["code"] == "not_found"
    # Nor through the tenant's own token list, which answers for tenant A only to A's admins.
    assert bearer(b_admin.secret).get("/api/v1/tenants/tenant-a/tokens/").status_code == 404
    assert bearer(b_admin.secret).delete(f"/api/v1/tenants/tenant-a/tokens/{a_member.token.pk}/").status_code == 404
    assert not ApiToken.all_tenants.filter(revoked_at__isnull=False).exists()
    # The owner's browser session manages all of them.
    assert {row["name"] for row in client_for(world.admin_b).get("/api/v1/tokens/").json()["results"]} == set(tokens)


def test_a_token_never_reads_or_revokes_a_more_powerful_one(world: World) -> None:
    tokens = dual_world(world)
    member = bearer(tokens["a-member"].secret)
    stronger = f"/api/v1/tokens/{tokens['a-admin'].token.pk}/"
    assert member.get(stronger).status_code == 404
    assert member.delete(stronger).status_code == 404
    assert ApiToken.all_tenants.get(pk=tokens["a-admin"].token.pk).revoked_at is None
    weaker = f"/api/v1/tokens/{tokens['a-viewer'].token.pk}/"
    assert member.get(weaker).status_code == 200
    assert member.delete(weaker).status_code == 200
    assert member.delete(f"/api/v1/tokens/{tokens['a-member'].token.pk}/").status_code == 200, "itself"
    assert bearer(tokens["a-member"].secret).get("/api/v1/me/").status_code == 401


def test_a_member_token_of_an_operator_cannot_touch_the_operators_token(world: World) -> None:
    operator = operator_token(world)
    Membership.all_tenants.create(tenant=world.tenant_a, user=world.operator, role="admin")
    member = services.create_token(
        actor=Actor(user=world.operator), tenant=world.tenant_a, name="m", role="member", expires_in_days=1
    )
    url = f"/api/v1/tokens/{operator.token.pk}/"
    assert listed(member.secret) == {"m"}
    assert bearer(member.secret).get(url).status_code == 404
    assert bearer(member.secret).delete(url).status_code == 404
    assert ApiToken.all_tenants.get(pk=operator.token.pk).revoked_at is None
    # The operator token acts as operator everywhere: it reaches all of its owner's tokens.
    assert listed(operator.secret) == {"ops", "m"}
    assert bearer(operator.secret).delete(f"/api/v1/tokens/{member.token.pk}/").status_code == 200


def test_the_service_holds_the_rule_for_every_caller(world: World) -> None:
    tokens = dual_world(world)
    owner = world.admin_b
    with pytest.raises(Http404):
        services.revoke_token(actor=Actor(user=owner, token=tokens["b-admin"].token), token=tokens["a-viewer"].token)
    with pytest.raises(PermissionDenied):
        services.revoke_token(actor=Actor(user=owner, token=tokens["a-member"].token), token=tokens["a-admin"].token)
    others = issue(world, "member_a", "member").token
    with pytest.raises(Http404):
        services.revoke_token(actor=Actor(user=owner, token=tokens["b-admin"].token), token=others)
    with pytest.raises(PermissionDenied):
        services.revoke_token(actor=Actor(user=owner), token=others)  # a member of A, not its admin
    assert not ApiToken.all_tenants.filter(revoked_at__isnull=False).exists()
    services.revoke_token(actor=Actor(user=owner, token=tokens["a-member"].token), token=tokens["a-viewer"].token)
    services.revoke_token(actor=Actor(user=owner), token=tokens["a-admin"].token)
    assert ApiToken.all_tenants.filter(revoked_at__isnull=False).count() == 2


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


# authenticate_secrets, authenticate_secret and reload_token: the one query behind every token check.


def operator_token(world: World) -> services.IssuedToken:
    return services.create_token(
        actor=Actor(user=world.operator), tenant=None, name="ops", role="operator", expires_in_days=30
    )


def outcome(secret: str) -> ApiToken | str:
    """Return what `authenticate_secret` gives for `secret`: the token, or the refusal's message."""
    try:
        return authenticate_secret(secret)
    except TokenRejected as rejected:
        return str(rejected)


def described(outcomes: list[ApiToken | TokenRejected]) -> list[int | str]:
    return [o.pk if isinstance(o, ApiToken) else str(o) for o in outcomes]


def test_a_batch_of_secrets_gets_each_its_own_outcome_in_order_from_one_query(world: World) -> None:
    valid, other_tenant, operator = issue(world), issue(world, "admin_b"), operator_token(world)
    revoked, expired = issue(world), issue(world)
    services.revoke_token(actor=Actor(user=world.admin_a), token=revoked.token)
    ApiToken.all_tenants.filter(pk=expired.token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    deactivated, left = issue(world, "member_a", "member"), issue(world, "viewer_a", "viewer")
    User.objects.filter(pk=world.member_a.pk).update(is_active=False)
    Membership.all_tenants.filter(user=world.viewer_a).delete()
    closed = Tenant.objects.create(slug="tenant-c", name="Closed")
    Membership.all_tenants.create(tenant=closed, user=world.admin_b, role="admin")
    of_closed = services.create_token(
        actor=Actor(user=world.admin_b), tenant=closed, name="c", role="admin", expires_in_days=1
    )
    Tenant.objects.filter(pk=closed.pk).update(is_active=False)
    wrong_key = f"gpc_{valid.token.prefix}_{'x' * 43}"
    batch = [
        (valid.secret, valid.token.pk),
        (revoked.secret, "This API token was revoked."),
        ("gpc_nothing", "Malformed API token."),
        (expired.secret, "This API token has expired."),
        ("gpc_ffffffffffff_abc", "Invalid API token."),
        (other_tenant.secret, other_tenant.token.pk),
        (wrong_key, "Invalid API token."),
        (deactivated.secret, "The token's owner is deactivated."),
        (left.secret, "The token's owner is no longer a member of its tenant."),
        (of_closed.secret, "The token's tenant is deactivated."),
        ("", "Malformed API token."),
        (operator.secret, operator.token.pk),
        (valid.secret, valid.token.pk),
    ]
    with CaptureQueriesContext(connection) as queries:
        got = authenticate_secrets([secret for secret, _ in batch])
    assert described(got) == [expected for _, expected in batch]
    statements = [q["sql"].lstrip().split(None, 1)[0].upper() for q in queries.captured_queries]
    assert sorted(statements) == ["SELECT", "UPDATE"]  # the tokens, then last_used_at of those due
    for secret, expected in batch:  # one by one, the same outcomes
        single = outcome(secret)
        assert (single.pk if isinstance(single, ApiToken) else single) == expected


def test_a_batch_without_a_well_formed_secret_reads_nothing(db: None) -> None:
    with CaptureQueriesContext(connection) as queries:
        got = authenticate_secrets(["gpc_nothing", "Bearer", ""])
    assert described(got) == ["Malformed API token."] * 3
    assert not queries.captured_queries
    assert authenticate_secrets([]) == []


def test_an_authenticated_token_carries_its_owner_tenant_and_role_without_further_queries(
    world: World, django_assert_num_queries: Any
) -> None:
    tenant_token, operator = issue(world, "admin_a", "member"), operator_token(world)
    found = authenticate_secrets([tenant_token.secret, operator.secret])
    assert all(isinstance(token, ApiToken) for token in found)
    mine, ops = (token for token in found if isinstance(token, ApiToken))
    with django_assert_num_queries(0):
        assert (mine.user.username, mine.tenant and mine.tenant.slug, mine.role) == ("admin_a", "tenant-a", "member")
        assert token_membership_role(mine) == Role.ADMIN  # the owner's role, which the token's caps
        assert (ops.user.username, ops.tenant, token_membership_role(ops)) == ("operator", None, None)


def test_loaded_tokens_hold_the_stored_values_with_aware_datetimes_and_real_booleans(world: World) -> None:
    issued = issue(world)
    expires = timezone.now().replace(microsecond=654321) + timedelta(days=3)
    ApiToken.all_tenants.filter(pk=issued.token.pk).update(expires_at=expires)
    User.objects.filter(pk=world.admin_a.pk).update(last_login=expires - timedelta(days=5, microseconds=1))
    token = authenticate_secret(issued.secret)
    stored = ApiToken.all_tenants.select_related("user", "tenant").get(pk=issued.token.pk)
    assert token.expires_at == expires
    assert token.tenant is not None and stored.tenant is not None
    for loaded, orm in ((token, stored), (token.user, stored.user), (token.tenant, stored.tenant)):
        for field in orm._meta.concrete_fields:
            value, expected = getattr(loaded, field.attname), getattr(orm, field.attname)
            assert (type(value), value) == (type(expected), expected), field.attname
            if isinstance(value, datetime):
                assert value.utcoffset() is not None, field.attname
    user, tenant = token.user, token.tenant
    assert (user.is_active, user.is_staff, user.is_superuser, tenant.is_active) == (True, False, False, True)
    assert all(type(flag) is bool for flag in (user.is_active, user.is_staff, user.is_superuser, tenant.is_active))


def test_last_used_is_refreshed_at_most_once_a_minute(world: World) -> None:
    issued = issue(world)

    def updates_when_authenticating() -> int:
        with CaptureQueriesContext(connection) as queries:
            authenticate_secret(issued.secret)
        return sum(q["sql"].lstrip().upper().startswith("UPDATE") for q in queries.captured_queries)

    def last_used() -> datetime | None:
        return ApiToken.all_tenants.get(pk=issued.token.pk).last_used_at

    assert updates_when_authenticating() == 1
    first = last_used()
    assert first is not None
    assert updates_when_authenticating() == 0
    assert last_used() == first
    assert authenticate_secret(issued.secret).last_used_at == first
    ApiToken.all_tenants.filter(pk=issued.token.pk).update(last_used_at=first - timedelta(seconds=61))
    assert updates_when_authenticating() == 1
    refreshed = last_used()
    assert refreshed is not None and refreshed >= first


def test_reload_token_loads_the_token_as_authentication_does(world: World, django_assert_num_queries: Any) -> None:
    issued = issue(world, "admin_a", "viewer")
    with django_assert_num_queries(1):
        token = reload_token(issued.token.pk)
        assert (token.pk, token.user.username, token.tenant and token.tenant.slug) == (
            issued.token.pk,
            "admin_a",
            "tenant-a",
        )
        assert token_membership_role(token) == Role.ADMIN
    assert type(token.user.is_active) is bool and token.expires_at.utcoffset() is not None
    assert token.expires_at == ApiToken.all_tenants.get(pk=issued.token.pk).expires_at


def test_reload_token_refuses_as_authentication_does(world: World) -> None:
    issued, left = issue(world), issue(world, "viewer_a", "viewer")
    Membership.all_tenants.filter(user=world.viewer_a).delete()
    services.revoke_token(actor=Actor(user=world.admin_a), token=issued.token)
    missing = ApiToken.all_tenants.order_by("-pk").values_list("pk", flat=True)[0] + 1
    for token_id, message in (
        (issued.token.pk, "This API token was revoked."),
        (left.token.pk, "The token's owner is no longer a member of its tenant."),
        (missing, "Invalid API token."),
    ):
        with pytest.raises(TokenRejected) as rejected:
            reload_token(token_id)
        assert str(rejected.value) == message
