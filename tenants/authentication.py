"""API token authentication: `Authorization: Bearer gpc_<prefix>_<key>`, and nothing else.

Tokens are never read from a URL or a form. Revocation, expiry, a
deactivated owner, a membership that ended or a deactivated tenant take
effect on the next request.

One query reads the token, its owner, its tenant and the owner's membership
role there; tenant endpoints reuse that role (`token_membership_role`)
rather than reading it again. The checks are `tenants.services.tokens.authenticate_secret`,
which the live streams call too.
"""

from __future__ import annotations

from django.contrib.auth.models import User
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from tenants.models import ApiToken
from tenants.services.tokens import TokenRejected, authenticate_secret, token_membership_role

__all__ = ["ApiTokenAuthentication", "token_membership_role"]


class ApiTokenAuthentication(BaseAuthentication):
    """Authenticate a request by a bearer API token; `request.auth` becomes the ApiToken."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[User, ApiToken] | None:
        header = get_authorization_header(request).decode("latin-1").split()
        if not header or header[0].lower() != self.keyword.lower():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("The Authorization header must be 'Bearer <token>'.")
        try:
            token = authenticate_secret(header[1])
        except TokenRejected as rejected:
            raise exceptions.AuthenticationFailed(str(rejected)) from None
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'
