"""Request body limits and deadlines, enforced in the ASGI layer before any byte is buffered.

Django's ASGI handler reads a request's whole body into a temporary file
(on disk past FILE_UPLOAD_MAX_MEMORY_SIZE) before any view, authentication
or size check runs; the submission ingest reads up to 16 MiB before it
authenticates. This middleware sits in front of both (`gpucloud/asgi.py`):

- each request gets a limit: the route's (`ROUTES`: volume uploads, agent
  reports) or the default, and the small anonymous one when it carries no
  valid session, API token or node credential;
- a declared Content-Length over the limit is answered 413 at once, unread;
- a body sent without one (chunked) is counted as it arrives: past the limit
  the app is told the client went away, the client gets 413 and nothing more
  is read;
- a body that arrives too slowly (an idle gap, or an average rate below
  BODY_MIN_BYTES_PER_SECOND after a grace period) is answered 408.

The limits are settings (BODY_LIMIT_*); the answers use the API's error envelope.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils.module_loading import import_string

from common.api.errors import error_body
from common.asgitypes import ASGIApp, Message, Receive, Scope, Send


@dataclass(frozen=True)
class Route:
    """Requests of `method` whose path matches `pattern` may send up to the setting `limit_setting` names.

    `streamed`: Django hands the view the body as it arrives instead of spooling it first (common.streaming).
    """

    method: str
    pattern: re.Pattern[str]
    limit_setting: str
    streamed: bool = False


ROUTES = (
    # The API's raw upload and the file browser's multipart upload into a volume (volume_files.upload_file).
    Route("PUT", re.compile(r"^/api/v1/tenants/[^/]+/volumes/[^/]+/files/content/?$"), "BODY_LIMIT_UPLOAD", True),
    # The page's posts are streamed too: its multipart upload is held to the room by frontend.uploads.RoomLimit.
    Route("POST", re.compile(r"^/t/[^/]+/storage/\d+/$"), "BODY_LIMIT_UPLOAD", True),
    # An agent's batch of reports (jobs.api.agent.AgentReportsEndpoint).
    Route("POST", re.compile(r"^/api/v1/agent/reports$"), "BODY_LIMIT_AGENT_REPORTS"),
)


class _Refused(Exception):
    """The body broke a rule: answer `status` with `code` and `message`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def route_limit(method: str, path: str) -> int:
    """Return the most bytes an authenticated request of `method` to `path` may send."""
    for route in ROUTES:
        if route.method == method and route.pattern.match(path):
            return int(getattr(settings, route.limit_setting))
    return int(settings.BODY_LIMIT_DEFAULT)


def streamed_route(method: str, path: str) -> bool:
    """Whether requests of `method` to `path` reach their view with the body unread (see Route.streamed)."""
    return any(route.streamed and route.method == method and route.pattern.match(path) for route in ROUTES)


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in scope.get("headers", [])}


def declared_length(scope: Scope) -> int | None:
    """Return the request's Content-Length, None when it has none (chunked); raises _Refused when malformed."""
    raw = _headers(scope).get(b"content-length")
    if raw is None:
        return None
    if not raw.isdigit():
        raise _Refused(400, "bad_request", "Content-Length is not a number.")
    return int(raw)


def _session_key(scope: Scope) -> str | None:
    raw = _headers(scope).get(b"cookie", b"").decode("latin-1")
    try:
        morsel = SimpleCookie(raw).get(settings.SESSION_COOKIE_NAME)
    except CookieError:
        return None
    return morsel.value if morsel is not None else None


def _bodiless(scope: Scope, declared: int | None) -> bool:
    """Whether the request can carry no body: HTTP/1.x frames one only by Content-Length or Transfer-Encoding
    (RFC 9112, 6.3), so a request with neither has none (HTTP/2 needs neither: it is never taken as bodiless)."""
    http1 = str(scope.get("http_version", "1.1")).startswith("1")
    return declared is None and http1 and b"transfer-encoding" not in _headers(scope)


# Principals recently recognised, by a digest of their credentials: the limit's lookup is a thread hop and a
# query, and every large request of a client would repeat it. Only a yes is kept, for PRINCIPAL_MEMORY_SECONDS:
# credentials revoked meanwhile may still send the larger limit that long, and are refused by the
# authentication behind as always.
PRINCIPAL_MEMORY_SECONDS = 10.0
_PRINCIPAL_MEMORY_SIZE = 4096
_principals: dict[bytes, float] = {}


def _credentials_digest(authorization: str, session_key: str | None) -> bytes:
    return hashlib.sha256(f"{authorization}\0{session_key or ''}".encode()).digest()


def _remembered(digest: bytes) -> bool:
    expires = _principals.get(digest)
    return expires is not None and expires > time.monotonic()


def _remember(digest: bytes) -> None:
    if len(_principals) >= _PRINCIPAL_MEMORY_SIZE:
        _principals.clear()  # bounded: a flood of distinct credentials costs lookups, never memory
    _principals[digest] = time.monotonic() + PRINCIPAL_MEMORY_SECONDS


async def request_limit(scope: Scope, declared: int | None) -> int:
    """Return the most bytes this request may send: the route's for a principal, else the anonymous limit."""
    anonymous = int(settings.BODY_LIMIT_ANONYMOUS)
    if (declared is not None and declared <= anonymous) or _bodiless(scope, declared):
        return anonymous  # small enough for anyone, or no body at all: no lookup needed
    authorization = _headers(scope).get(b"authorization", b"").decode("latin-1")
    session_key = _session_key(scope)
    digest = _credentials_digest(authorization, session_key)
    if not _remembered(digest):
        # The check names apps (tokens, node credentials): the setting points at it, as common imports no app.
        is_principal = import_string(settings.BODY_LIMIT_PRINCIPAL_CHECK)
        if not await database_sync_to_async(is_principal)(authorization, session_key):
            return anonymous
        _remember(digest)
    return route_limit(scope.get("method", ""), scope.get("path", ""))


class BodyGuard:
    """A receive callable that passes the body on while it stays within `limit` and its deadlines."""

    def __init__(self, receive: Receive, limit: int) -> None:
        self.receive, self.limit = receive, limit
        self.received = 0
        self.started = time.monotonic()
        self.refused: _Refused | None = None
        self.done = False

    async def __call__(self) -> Message:
        if self.refused is not None or self.done:
            # Past a refusal, or once the body is whole, the app only waits for the disconnect.
            return await self.receive() if self.refused is None else {"type": "http.disconnect"}
        try:
            message = await asyncio.wait_for(self.receive(), timeout=self._timeout())
        except TimeoutError:
            return self._refuse(408, "timeout", "The request body arrived too slowly.")
        if message["type"] != "http.request":
            return message
        self.received += len(message.get("body", b""))
        if self.received > self.limit:
            return self._refuse(413, "too_large", f"The request body is larger than {self.limit} bytes.")
        self.done = not message.get("more_body", False)
        return message

    def _timeout(self) -> float:
        # The next chunk may wait an idle gap, and the body as a whole must keep a minimum average rate.
        rate_deadline = (
            self.started + settings.BODY_READ_GRACE_SECONDS + self.received / settings.BODY_MIN_BYTES_PER_SECOND
        )
        return max(0.0, min(float(settings.BODY_IDLE_SECONDS), rate_deadline - time.monotonic()))

    def _refuse(self, status: int, code: str, message: str) -> Message:
        self.refused = _Refused(status, code, message)
        return {"type": "http.disconnect"}


class ResponseWatch:
    """A send callable that remembers whether a response began; once `guard` refused the body, the app's own
    answer (a view that was reading it fails) is replaced by the refusal."""

    def __init__(self, send: Send, guard: BodyGuard) -> None:
        self.send, self.guard = send, guard
        self.started = False
        self.replaced = False

    async def __call__(self, message: Message) -> None:
        if self.replaced:
            return
        if message["type"] == "http.response.start":
            self.started = True
            if self.guard.refused is not None:
                self.replaced = True
                await send_refusal(self.send, self.guard.refused)
                return
        await self.send(message)


async def send_refusal(send: Send, refused: _Refused) -> None:
    """Answer `refused` in the API's error envelope and close the connection (the rest of the body is unread)."""
    body = json.dumps(error_body(refused.code, refused.message)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: every HTTP request's body within its limit and deadlines, or refused before it is read."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            declared = declared_length(scope)
            limit = await request_limit(scope, declared)
            if declared is not None and declared > limit:
                raise _Refused(413, "too_large", f"The request body is larger than {limit} bytes.")
        except _Refused as refused:
            await send_refusal(send, refused)
            return
        guard = BodyGuard(receive, limit)
        watch = ResponseWatch(send, guard)
        await self.app(scope, guard, watch)
        if guard.refused is not None and not watch.started:
            await send_refusal(send, guard.refused)
