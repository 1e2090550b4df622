"""Personal API tokens: created with a role no higher than the owner's, stored as a digest, shown once."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from common.errors import invalid
from tenants import fast_sql
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import ApiToken, Tenant
from tenants.selectors import own_tokens_within_reach
from tenants.services.access import require_role
from tenants.services.audit import JsonDict, record_audit_event, update_audited

TOKEN_SCHEME = "gpc"  # noqa: S105 -- the token format's prefix, not a secret
# last_used_at is advisory; refreshing it at most once a minute keeps
# authenticated requests from all writing to the token row.
_LAST_USED_RESOLUTION = timedelta(minutes=1)
# Set only on tokens this module loaded: a token read elsewhere has no such attribute.
_MEMBERSHIP_ROLE = "authenticated_membership_role"


class TokenRejected(Exception):
    """A presented token authenticates nobody; the message says why, in words fit for the client."""


@dataclass(frozen=True)
class IssuedToken:
    """A new token and its secret, which exists only here and is never stored."""

    token: ApiToken
    secret: str


def digest(secret: str) -> str:
    """Return the stored form of a token secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def split_secret(secret: str) -> tuple[str, str] | None:
    """Return (prefix, secret) of a well-formed `gpc_<prefix>_<key>` string, else None."""
    parts = secret.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_SCHEME or not parts[1] or not parts[2]:
        return None
    return parts[1], secret


def matches(token: ApiToken, secret: str) -> bool:
    """Return whether `secret` is the token's, comparing digests in constant time."""
    return hmac.compare_digest(token.digest, digest(secret))


def token_membership_role(token: ApiToken) -> Role | None:
    """Return the owner's membership role in the token's tenant as read when the token was authenticated,
    or None when the token was not loaded by `authenticate_secret` or `reload_token` (or has no tenant)."""
    role = getattr(token, _MEMBERSHIP_ROLE, None)
    return Role(role) if role else None


def _tokens_with_membership(field: str, values: Sequence[Any]) -> list[ApiToken]:
    """Return the tokens whose `field` is in `values`, each with its owner, tenant and the owner's membership
    role there loaded; one query (`tenants.fast_sql.tokens_with_role`)."""
    tokens = []
    for token, role in fast_sql.tokens_with_role(field, values):
        setattr(token, _MEMBERSHIP_ROLE, role)
        tokens.append(token)
    return tokens


def _token_with_membership(field: str, value: object) -> ApiToken | None:
    """Return the token whose `field` is `value` as `_tokens_with_membership` loads it, or None; one query."""
    found = _tokens_with_membership(field, [value])
    return found[0] if found else None


def _check_usable(token: ApiToken) -> None:
    if token.revoked_at is not None:
        raise TokenRejected("This API token was revoked.")
    if token.expires_at <= timezone.now():
        raise TokenRejected("This API token has expired.")
    if not token.user.is_active:
        raise TokenRejected("The token's owner is deactivated.")
    if token.tenant_id is not None and token_membership_role(token) is None:
        raise TokenRejected("The token's owner is no longer a member of its tenant.")
    if token.tenant is not None and not token.tenant.is_active:
        raise TokenRejected("The token's tenant is deactivated.")


def authenticate_secret(secret: str) -> ApiToken:
    """Return the token whose secret is `secret`, with its owner, tenant and the owner's role there loaded.

    The one check behind every way a token is presented (the API's
    Authorization header, the live streams' header or subprotocol).
    Refreshes `last_used_at` (at most once a minute). Raises TokenRejected
    for a malformed, unknown, revoked or expired token, a deactivated owner,
    an owner no longer a member of the token's tenant, or a deactivated tenant.
    """
    outcome = authenticate_secrets([secret])[0]
    if isinstance(outcome, TokenRejected):
        raise outcome
    return outcome


def authenticate_secrets(secrets: Sequence[str]) -> list[ApiToken | TokenRejected]:
    """Check many secrets at once, as `authenticate_secret` checks one: return each one's token or refusal.

    One query reads every token (and one update refreshes those whose
    `last_used_at` is due), for interfaces that authenticate concurrent
    requests together.
    """
    parsed = [split_secret(secret) for secret in secrets]
    prefixes = sorted({p[0] for p in parsed if p is not None})
    tokens = {t.prefix: t for t in _tokens_with_membership("prefix", prefixes)}
    outcomes: list[ApiToken | TokenRejected] = []
    for secret, split in zip(secrets, parsed, strict=True):
        token = tokens.get(split[0]) if split is not None else None
        if split is None:
            outcomes.append(TokenRejected("Malformed API token."))
        elif token is None or not matches(token, secret):
            outcomes.append(TokenRejected("Invalid API token."))
        else:
            try:
                _check_usable(token)
            except TokenRejected as rejected:
                outcomes.append(rejected)
            else:
                outcomes.append(token)
    _touch([t for t in outcomes if isinstance(t, ApiToken)])
    return outcomes


def _touch(tokens: Sequence[ApiToken]) -> None:
    """Refresh `last_used_at` of the tokens last used more than a minute ago, in one update."""
    now = timezone.now()
    due = {t.pk for t in tokens if t.last_used_at is None or now - t.last_used_at > _LAST_USED_RESOLUTION}
    if due:
        ApiToken.all_tenants.filter(pk__in=due).update(last_used_at=now)
    for token in tokens:
        if token.pk in due:
            token.last_used_at = now


def reload_token(token_id: int) -> ApiToken:
    """Return token `token_id` loaded as `authenticate_secret` loads it, if it still authenticates its owner.

    For connections that authenticated once and re-check later (live
    streams). Raises TokenRejected as `authenticate_secret` does, and for a
    token that no longer exists.
    """
    token = _token_with_membership("id", token_id)
    if token is None:
        raise TokenRejected("Invalid API token.")
    _check_usable(token)
    return token


def _token_snapshot(token: ApiToken) -> JsonDict:
    return {
        "name": token.name,
        "role": token.role,
        "prefix": token.prefix,
        "user": token.user.get_username(),
        "expires_at": token.expires_at.isoformat(),
        "revoked_at": token.revoked_at.isoformat() if token.revoked_at else None,
    }


def default_token_role(actor: Actor, tenant: Tenant | None) -> Role:
    """Return the role a new token of `actor` in `tenant` gets when none is asked for: the owner's own.

    That is the owner's role in `tenant` (tenant admin for an operator, whose
    tenant tokens cannot be operator tokens), or operator for an operator's
    token without a tenant, and never more than the acting token's role.
    Raises Http404 when `actor` has no role in `tenant`, ValidationError on
    `tenant` when a non-operator names none.
    """
    if tenant is None:
        if not actor.is_operator:
            raise invalid("tenant", "required", "A token with a tenant role must name its tenant.")
        own = Role.OPERATOR
    else:
        own = require_role(actor, tenant, Role.VIEWER)
        own = Role.ADMIN if own == Role.OPERATOR else own
    if actor.token is not None and not Role(actor.token.role).at_least(own):
        own = Role(actor.token.role)
    return own


def _check_role(actor: Actor, tenant: Tenant | None, role: str) -> Role:
    if role not in Role.values:
        raise invalid("role", "invalid_choice", f"Role must be one of {', '.join(Role.values)}.")
    wanted = Role(role)
    if wanted == Role.OPERATOR:
        if not actor.is_operator:
            raise PermissionDenied("Only operators can create operator tokens.")
        if tenant is not None:
            raise invalid(
                "tenant",
                "operator_token_has_no_tenant",
                "Operator tokens act on the whole platform; leave tenant empty.",
            )
        return wanted
    if tenant is None:
        raise invalid("tenant", "required", "A token with a tenant role must name its tenant.")
    own = require_role(actor, tenant, Role.VIEWER)
    if not own.at_least(wanted):
        raise invalid("role", "above_own_role", f"A token's role cannot be above your own ({own.value}).")
    return wanted


def _bounded_expiry(parent: ApiToken | None, wanted: datetime) -> datetime:
    """Return `wanted`, or the expiry of the token that mints the new one when that comes first: a token
    never makes credentials that outlive it (a stolen short-lived token must not become a long one)."""
    return wanted if parent is None else min(wanted, parent.expires_at)


@transaction.atomic
def create_token(
    *, actor: Actor, tenant: Tenant | None, name: str, role: str | None = None, expires_in_days: int
) -> IssuedToken:
    """Create a token for the acting user and return it with its secret.

    `role` None gives the token the owner's own role in `tenant` (a tenant
    admin's for an operator, an operator's when an operator names no
    tenant), never above the acting token's own. A token minted by a token
    (`actor.token`) expires no later than it and is revoked with it
    (`revoke_token`). Raises ValidationError
    naming every failing field at once (a blank name, a lifetime outside
    1..API_TOKEN_MAX_DAYS, a role above the owner's); PermissionDenied when
    the actor is itself a token of another tenant.
    """
    if actor.user is None:
        raise PermissionDenied("Tokens belong to users.")
    errors: dict[str, list[ValidationError]] = {}
    if not name.strip() or len(name) > 80:
        errors["name"] = [ValidationError("Give the token a name of 1 to 80 characters.", code="invalid")]
    if not 1 <= expires_in_days <= settings.API_TOKEN_MAX_DAYS:
        message = f"Must be between 1 and {settings.API_TOKEN_MAX_DAYS} days."
        errors["expires_in_days"] = [ValidationError(message, code="out_of_range")]
    try:
        # The default goes through the same checks as a role asked for: one rule for both.
        granted = _check_role(actor, tenant, role if role is not None else default_token_role(actor, tenant))
        if actor.token is not None and not Role(actor.token.role).at_least(granted):
            raise invalid("role", "above_own_role", "A token cannot create a token with more rights than itself.")
    except ValidationError as error:
        errors.update(error.error_dict)
    if errors:
        raise ValidationError(errors)
    prefix = secrets.token_hex(6)
    secret = f"{TOKEN_SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.all_tenants.create(
        tenant=tenant,
        user=actor.user,
        parent=actor.token,
        name=name.strip(),
        role=granted,
        prefix=prefix,
        digest=digest(secret),
        expires_at=_bounded_expiry(actor.token, timezone.now() + timedelta(days=expires_in_days)),
    )
    record_audit_event(
        actor=actor, action="api_token.create", obj=token, tenant_id=token.tenant_id, after=_token_snapshot(token)
    )
    return IssuedToken(token=token, secret=secret)


def require_token_manageable(actor: Actor, token: ApiToken) -> None:
    """Return when `actor` may read and revoke `token`; the one check every interface makes.

    Its owner may, through any credential that reaches it
    (`tenants.selectors.own_tokens_within_reach`: never a token of another
    tenant, nor one more powerful than the credential); operators may; so may
    the admins of its tenant. Raises Http404 when `actor` has no role in the
    token's tenant (a token of another tenant is never even acknowledged),
    PermissionDenied when it has one below admin, or for an operator token
    the actor does not reach.
    """
    if actor.user is None:
        raise PermissionDenied("Tokens are managed by users.")
    if token.user_id == actor.user.pk and own_tokens_within_reach(actor).filter(pk=token.pk).exists():
        return
    if actor.is_operator:
        return
    tenant = token.tenant
    if tenant is None:
        raise PermissionDenied("Only operators manage operator tokens.")
    require_role(actor, tenant, Role.ADMIN)


@transaction.atomic
def revoke_token(*, actor: Actor, token: ApiToken) -> ApiToken:
    """Revoke `token` so that its next request is refused; who may is `require_token_manageable`'s rule.

    Every token minted by it, directly or through others, is revoked with
    it (one audit event each): what a token made dies with it. Revoking an
    already revoked token changes nothing and writes no event.
    """
    require_token_manageable(actor, token)
    token = ApiToken.all_tenants.select_for_update(of=("self",)).select_related("user").get(pk=token.pk)
    if token.revoked_at is not None:
        return token
    revoked = _revoke_one(actor, token)
    for child in _live_descendants(token):
        _revoke_one(actor, child)
    return revoked


def _revoke_one(actor: Actor, token: ApiToken) -> ApiToken:
    return update_audited(
        actor=actor,
        action="api_token.revoke",
        obj=token,
        changes={"revoked_at": timezone.now()},
        tenant_id=token.tenant_id,
        audited=_token_snapshot,
    )


def _live_descendants(token: ApiToken) -> list[ApiToken]:
    """Return the unrevoked tokens minted from `token`, at any depth, locked for update; one query a level."""
    found: list[ApiToken] = []
    level = [token.pk]
    while level:
        children = list(
            ApiToken.all_tenants.select_for_update(of=("self",))
            .select_related("user")
            .filter(parent_id__in=level, revoked_at__isnull=True)
        )
        found.extend(children)
        level = [child.pk for child in children]
    return found
