"""API token authentication: `Authorization: Bearer gpc_<prefix>_<key>`, and nothing else.

Tokens are never read from a URL or a form. Revocation, expiry, a
deactivated owner or a membership that ended take effect on the next request.

One query reads the token, its owner, its tenant and the owner's membership
role there; tenant endpoints reuse that role (`token_membership_role`)
rather than reading it again.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import User
from django.db.models import OuterRef, Subquery
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from tenants.choices import Role
from tenants.models import ApiToken, Membership
from tenants.services.tokens import matches, split_secret

# last_used_at is advisory; refreshing it at most once a minute keeps
# authenticated requests from all writing to the token row.
_LAST_USED_RESOLUTION = timedelta(minutes=1)
# Set only on tokens this module loaded: a token read elsewhere has no such attribute.
_MEMBERSHIP_ROLE = "authenticated_membership_role"


def token_membership_role(token: ApiToken) -> Role | None:
    """Return the owner's membership role in the token's tenant as read when this request authenticated,
    or None when the token was not loaded by `ApiTokenAuthentication` (or has no tenant)."""
    role = getattr(token, _MEMBERSHIP_ROLE, None)
    return Role(role) if role else None


def _token_with_membership(prefix: str) -> ApiToken | None:
    membership = Membership.all_tenants.filter(tenant_id=OuterRef("tenant_id"), user_id=OuterRef("user_id"))
    tokens = ApiToken.all_tenants.select_related("user", "tenant").filter(prefix=prefix)
    return tokens.annotate(**{_MEMBERSHIP_ROLE: Subquery(membership.values("role")[:1])}).first()


class ApiTokenAuthentication(BaseAuthentication):
    """Authenticate a request by a bearer API token; `request.auth` becomes the ApiToken."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[User, ApiToken] | None:
        header = get_authorization_header(request).decode("latin-1").split()
        if not header or header[0].lower() != self.keyword.lower():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("The Authorization header must be 'Bearer <token>'.")
        parsed = split_secret(header[1])
        if parsed is None:
            raise exceptions.AuthenticationFailed("Malformed API token.")
        return self._check(*parsed)

    def _check(self, prefix: str, secret: str) -> tuple[User, ApiToken]:
        token = _token_with_membership(prefix)
        if token is None or not matches(token, secret):
            raise exceptions.AuthenticationFailed("Invalid API token.")
        now = timezone.now()
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This API token was revoked.")
        if token.expires_at <= now:
            raise exceptions.AuthenticationFailed("This API token has expired.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("The token's owner is deactivated.")
        if token.tenant_id is not None and token_membership_role(token) is None:
            raise exceptions.AuthenticationFailed("The token's owner is no longer a member of its tenant.")
        if token.last_used_at is None or now - token.last_used_at > _LAST_USED_RESOLUTION:
            ApiToken.all_tenants.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'
