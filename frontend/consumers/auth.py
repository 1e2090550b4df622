"""Who opens a live stream: the handshake's session cookie or API token, its Origin, and re-checking it later.

A browser authenticates with the console's session cookie (Channels'
AuthMiddlewareStack reads it). Other clients present an API token, in an
`Authorization: Bearer <token>` header or as the WebSocket subprotocol
`gpucloud.bearer.<token>` (beside `gpucloud.v1`, the one the server
accepts, so the token is never echoed); never in the URL. Tokens go
through `authenticate_secret`, the API's own check, so a token reaches
exactly what it reaches on the API.

Origin: a handshake without a token (a cookie, or nothing) must come from
the console's own origin, scheme, host and port alike, never the notebook
origin (`jobs.proxy.same_site_origin`); a token may come with no Origin (non-browser
clients send none), but an Origin it sends must be allowed too, so a page
elsewhere cannot use a token either. A refused Origin fails the handshake
itself (HTTP 403), before any consumer runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from importlib import import_module
from typing import Any

from channels.db import database_sync_to_async
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.auth import get_user
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest

from jobs.proxy import ASGIApp, Receive, Scope, Send, same_site_origin
from tenants.context import Actor
from tenants.services.tokens import TokenRejected, authenticate_secret, reload_token

PROTOCOL = "gpucloud.v1"
BEARER_PROTOCOL = "gpucloud.bearer."


@dataclass(frozen=True)
class Principal:
    """Who authenticated a connection and how: by token (`token_id`) or by session (`session_key`)."""

    user_id: int
    token_id: int | None = None
    session_key: str | None = None


@dataclass(frozen=True)
class Access:
    """What a principal still is now: the actor to authorize, and when its token or session expires."""

    actor: Actor
    expires_at: datetime | None


def bearer_secret(scope: Scope) -> str | None:
    """Return the token the handshake presents (Authorization header first, then subprotocol), or None."""
    for key, value in scope.get("headers") or []:
        if key.lower() == b"authorization":
            scheme, _, secret = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and secret.strip():
                return secret.strip()
    for protocol in scope.get("subprotocols") or []:
        if protocol.startswith(BEARER_PROTOCOL) and len(protocol) > len(BEARER_PROTOCOL):
            return str(protocol[len(BEARER_PROTOCOL) :])
    return None


def origin_allowed(scope: Scope, *, token: bool) -> bool:
    """Return whether the handshake's Origin may open a stream: the console's own origin, or none with a token."""
    origins = [value for key, value in scope.get("headers") or [] if key.lower() == b"origin"]
    if not origins:
        return token
    return same_site_origin(scope)


def _session_principal(scope: Scope) -> Principal | None:
    user = scope.get("user")
    session = scope.get("session")
    if user is None or not user.is_authenticated or session is None or not session.session_key:
        return None
    return Principal(user_id=user.pk, session_key=session.session_key)


def _token_principal(secret: str) -> tuple[Principal | None, Any]:
    try:
        token = authenticate_secret(secret)
    except TokenRejected:
        return None, AnonymousUser()
    return Principal(user_id=token.user_id, token_id=token.pk), token.user


class LiveAuthMiddleware:
    """Set `scope["live_principal"]` (None: not authenticated) and refuse handshakes from foreign origins.

    Wraps the WebSocket router inside AuthMiddlewareStack, which has
    resolved the session's user by then. A presented token wins over a
    cookie, as on the API.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        secret = bearer_secret(scope)
        if not origin_allowed(scope, token=secret is not None):
            await WebsocketDenier()(scope, receive, send)
            return
        if secret is None:
            scope = {**scope, "live_principal": _session_principal(scope)}
        else:
            principal, user = await database_sync_to_async(_token_principal)(secret)
            scope = {**scope, "live_principal": principal, "user": user}
        await self.app(scope, receive, send)


def _session_expiry(store: Any, key: str) -> datetime | None:
    # Database-backed stores know the stored expiry; others (signed cookies, cache) leave it to the backstop.
    model = getattr(store, "get_model_class", None)
    if model is None:
        return None
    expiry: datetime | None = model().objects.filter(session_key=key).values_list("expire_date", flat=True).first()
    return expiry


def current_access(principal: Principal) -> Access | None:
    """Return what `principal` is now, or None when its token or session no longer authenticates its user.

    A token is re-read as the API reads it (revoked, expired, owner
    deactivated or no longer a member: None). A session must still exist,
    be unexpired and belong to the same active user with the same password.
    """
    if principal.token_id is not None:
        try:
            token = reload_token(principal.token_id)
        except TokenRejected:
            return None
        return Access(actor=Actor(user=token.user, token=token), expires_at=token.expires_at)
    if principal.session_key is None:
        return None
    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(principal.session_key)
    user = get_user(request)
    if not user.is_authenticated or user.pk != principal.user_id or not user.is_active:
        return None
    return Access(actor=Actor(user=user), expires_at=_session_expiry(request.session, principal.session_key))
