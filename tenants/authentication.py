"""API token authentication: `Authorization: Bearer gpc_<prefix>_<key>`, and nothing else.

Tokens are never read from a URL or a form. Revocation, expiry, a
deactivated owner or a membership that ended take effect on the next request.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from tenants.models import ApiToken, Membership
from tenants.services.tokens import matches, split_secret

# last_used_at is advisory; refreshing it at most once a minute keeps
# authenticated requests from all writing to the token row.
_LAST_USED_RESOLUTION = timedelta(minutes=1)


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
        token = ApiToken.all_tenants.select_related("user", "tenant").filter(prefix=prefix).first()
        if token is None or not matches(token, secret):
            raise exceptions.AuthenticationFailed("Invalid API token.")
        now = timezone.now()
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This API token was revoked.")
        if token.expires_at <= now:
            raise exceptions.AuthenticationFailed("This API token has expired.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("The token's owner is deactivated.")
        if (
            token.tenant_id is not None
            and not Membership.all_tenants.filter(tenant_id=token.tenant_id, user_id=token.user_id).exists()
        ):
            raise exceptions.AuthenticationFailed("The token's owner is no longer a member of its tenant.")
        if token.last_used_at is None or now - token.last_used_at > _LAST_USED_RESOLUTION:
            ApiToken.all_tenants.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'
