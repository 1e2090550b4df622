"""The notebook proxy: `/notebooks/<workload id>/...` over HTTP and WebSocket, to the notebook's Jupyter server.

A raw ASGI app in front of the console's own apps (`gpucloud/asgi.py`):
every other path goes to them untouched. For a notebook path it

1. authenticates the console's session cookie (Django's session store and
   `get_user`, the same login as the pages) and asks
   `jobs.selectors.notebook_proxy_target`, both in one hop to a database
   thread, on every request and every WebSocket connect, so revoked access
   ends at once. Anyone without access gets the same 404 (HTTP) or refused
   handshake (WebSocket) as for a notebook that does not exist. An open
   WebSocket asks again whenever its user's access may have changed (the
   live streams' announcements) and every LIVE_RECHECK_SECONDS, and closes
   with 4403 once access is gone (a removed member, a deactivated tenant);
2. forwards the request to the same path and query on the endpoint of the
   notebook's first replica (Jupyter runs with `base_url=/notebooks/<id>/`),
   adding `Authorization: token <session secret>` and dropping the
   console's session and CSRF cookies, any incoming `Authorization`,
   hop-by-hop headers; Host and Origin become the upstream's own, so
   Jupyter's origin checks pass;
3. streams both ways: request bodies up, response bodies and WebSocket
   frames (text and binary) down, until either side closes.

The session secret never reaches the browser: Jupyter's login cookie is
not passed on (the proxy authenticates every request itself), and any
occurrence of the secret in response headers, bodies and frames is masked
with asterisks of the same length (JupyterLab writes its token into its
pages). Masking needs plain bytes, so the upstream is asked for identity
encoding (jupyter_server compresses nothing anyway).

Because the token authenticates every upstream request, Jupyter skips its
own XSRF check: unsafe methods must therefore carry an Origin among the
console's allowed hosts, the rule WebSocket connects already follow.
"""

from __future__ import annotations

import asyncio
import logging
import re
import weakref
from collections.abc import AsyncIterator, Awaitable, Iterable
from contextlib import suppress
from importlib import import_module
from urllib.parse import urlsplit

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.security.websocket import AllowedHostsOriginValidator
from django.conf import settings
from django.contrib.auth import get_user
from django.http import HttpRequest, parse_cookie
from django.http.request import validate_host
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from gpucloud.asgitypes import ASGIApp, Message, Receive, Scope, Send
from gpucloud.live_layer import LIVE_ALIAS, access_group
from jobs.selectors import ProxyTarget, notebook_proxy_target
from jobs.upstream import UpstreamError, UpstreamPool, UpstreamResponse, UpstreamTimeout

logger = logging.getLogger(__name__)

NOTEBOOK_PATH = re.compile(r"^/notebooks/(?P<workload>[1-9][0-9]{0,17})/")
"""The paths the proxy serves; the id is bounded so it always fits a database integer."""

CONNECT_TIMEOUT = 5.0
"""Seconds to reach the notebook's server (a local network hop; more means it is down)."""
IO_TIMEOUT = 120.0
"""Seconds the upstream may stay silent mid-request (a long save or a large conversion)."""
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest WebSocket message relayed from the upstream (kernel outputs may carry images)."""

_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer"}
    | {b"transfer-encoding", b"upgrade"}
)
# Set by the proxy itself, or by the WebSocket client library during its own handshake.
_REPLACED = frozenset({b"host", b"authorization", b"cookie", b"origin", b"accept-encoding"})
_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Jupyter's XSRF cookie is harmless to pass on; its login cookie is a credential the browser must not hold.
_PASSED_COOKIES = frozenset({"_xsrf"})
REVOKED = 4403
"""The code the browser's WebSocket closes with when its user loses access to the notebook, as the live streams'."""
_SENDABLE_CLOSE = re.compile(r"^(100[0-3]|10(0[7-9]|1[0-4])|[34][0-9]{3})$")


class SecretMask:
    """Replaces a secret with asterisks of the same length in a stream of chunks, also across chunk boundaries.

    Only a chunk's tail that could begin the secret is held back until the
    next chunk (usually nothing), so streamed responses are not delayed.
    """

    def __init__(self, secret: str) -> None:
        self.secret = secret.encode()
        self.masked = b"*" * len(self.secret)
        self._held = b""

    def replace(self, data: bytes) -> bytes:
        """Return `data` (one whole message) with every occurrence of the secret masked."""
        return data.replace(self.secret, self.masked) if self.secret else data

    def feed(self, chunk: bytes) -> bytes:
        """Return what of the stream so far can be released, masked."""
        data = self.replace(self._held + chunk)
        held = self._partial_suffix(data)
        self._held = data[len(data) - held :] if held else b""
        return data[: len(data) - held]

    def flush(self) -> bytes:
        """Return what is still held back at the end of the stream."""
        held, self._held = self._held, b""
        return held

    def _partial_suffix(self, data: bytes) -> int:
        """Return the length of the longest tail of `data` that begins the secret (0 when none does)."""
        if not self.secret:
            return 0
        # Runs on every chunk of a download: a C-level search for the secret's first byte in the
        # last len(secret) - 1 bytes usually finds none, instead of one endswith per possible length.
        # A whole secret cannot start there: `data` is already masked.
        first = self.secret[0]
        at = data.find(first, max(len(data) - len(self.secret) + 1, 0))
        while at != -1:
            if self.secret.startswith(data[at:]):
                return len(data) - at
            at = data.find(first, at + 1)
        return 0


def session_key(scope: Scope) -> str | None:
    """Return the console session cookie's value from the request's Cookie headers, or None."""
    joined = "; ".join(value.decode("latin-1") for key, value in scope.get("headers") or [] if key.lower() == b"cookie")
    return parse_cookie(joined).get(settings.SESSION_COOKIE_NAME) or None


def authorize(key: str | None, workload_id: int) -> ProxyTarget | None:
    """Return where the user logged in with console session `key` reaches notebook `workload_id`, or None.

    Django's own session store and `get_user` (which also checks the
    session against the user's password hash), then the selector: one
    call, so the proxy crosses to a database thread once per request.
    """
    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(key)
    return notebook_proxy_target(get_user(request), workload_id)


def _dropped(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Return the hop-by-hop header names: the fixed ones and those the Connection header lists."""
    listed = {
        name.strip().lower() for key, value in headers if key.lower() == b"connection" for name in value.split(b",")
    }
    return _HOP_BY_HOP | listed


def _console_cookies() -> frozenset[str]:
    return frozenset({settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME})


def _without_console_cookies(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """Return the request's cookies, minus the console's session and CSRF cookies, as one Cookie header value."""
    console = _console_cookies()
    kept = [
        pair.strip()
        for key, value in headers
        if key.lower() == b"cookie"
        for pair in value.decode("latin-1").split(";")
        if pair.strip() and pair.split("=", 1)[0].strip() not in console
    ]
    return "; ".join(kept)


def _origin(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    return f"{parts.scheme}://{parts.netloc}"


def upstream_headers(scope: Scope, target: ProxyTarget, *, websocket: bool) -> list[tuple[str, str]]:
    """Return the headers to send upstream: the client's, minus what the console owns, plus the session token."""
    headers: list[tuple[bytes, bytes]] = scope.get("headers") or []
    csrf_header = settings.CSRF_HEADER_NAME.removeprefix("HTTP_").replace("_", "-").lower().encode()
    dropped = _dropped(headers) | _REPLACED | {csrf_header}
    kept = [
        (key.decode("latin-1"), value.decode("latin-1"))
        for key, value in headers
        if key.lower() not in dropped and not (websocket and key.lower().startswith(b"sec-websocket-"))
    ]
    cookies = _without_console_cookies(headers)
    if cookies:
        kept.append(("cookie", cookies))
    kept.append(("authorization", f"token {target.secret}"))
    if not websocket:  # the WebSocket client sets Origin itself, from the `origin` argument
        kept += [("origin", _origin(target.endpoint)), ("accept-encoding", "identity")]
    return kept


def _set_cookie_passes(value: bytes) -> bool:
    name = value.split(b"=", 1)[0].strip().decode("latin-1")
    return name in _PASSED_COOKIES and name not in _console_cookies()


def downstream_headers(headers: list[tuple[bytes, bytes]], mask: SecretMask) -> list[tuple[bytes, bytes]]:
    """Return the upstream's response headers fit for the browser: no hop-by-hop, no credentials, secret masked."""
    dropped = _dropped(headers)
    return [
        (key.lower(), mask.replace(value))
        for key, value in headers
        if key.lower() not in dropped and (key.lower() != b"set-cookie" or _set_cookie_passes(value))
    ]


def upstream_url(endpoint: str, scope: Scope, *, websocket: bool = False) -> str:
    """Return the upstream URL of the request: the same raw path and query on `endpoint`."""
    path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    base = endpoint.rstrip("/")
    if websocket:
        base = "ws" + base.removeprefix("http")
    return f"{base}{path}?{query}" if query else f"{base}{path}"


def _allowed_hosts() -> list[str]:
    # Django's own fallback when DEBUG runs with no ALLOWED_HOSTS (see HttpRequest.get_host).
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [".localhost", "127.0.0.1", "[::1]"]
    return list(settings.ALLOWED_HOSTS)


def same_site_origin(scope: Scope) -> bool:
    """Return True when the request's Origin header names one of the console's allowed hosts."""
    origins = [value for key, value in scope.get("headers") or [] if key.lower() == b"origin"]
    if len(origins) != 1:
        return False
    host = urlsplit(origins[0].decode("latin-1")).hostname
    return bool(host) and validate_host(host or "", _allowed_hosts())


def _sendable(code: int | None, fallback: int = 1000) -> int:
    """Return `code` if it may be sent in a close frame (1005 and 1006 only describe one), else `fallback`."""
    return code if code is not None and _SENDABLE_CLOSE.match(str(code)) else fallback


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _ClientGone(Exception):
    """The browser went away while its request body was being read."""


async def _request_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        if message.get("body"):
            yield message["body"]
        if not message.get("more_body"):
            return


def _has_body(scope: Scope) -> bool:
    names = {key.lower() for key, _ in scope.get("headers") or []}
    return b"content-length" in names or b"transfer-encoding" in names


async def _first_of(*work: Awaitable[None]) -> None:
    """Run `work` concurrently until the first ends, then cancel the rest; re-raise the first's error, if any."""
    tasks = [asyncio.ensure_future(each) for each in work]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class NotebookProxy:
    """ASGI app: serves `/notebooks/<id>/...` (HTTP and WebSocket) itself and hands every other request to `app`.

    It also answers the lifespan protocol (closing its upstream connections
    at shutdown), which the console's router does not speak.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # The same origin rule as the console's own WebSocket consumers.
        self._websocket: ASGIApp = AllowedHostsOriginValidator(self._serve)
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, UpstreamPool] = weakref.WeakKeyDictionary()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and NOTEBOOK_PATH.match(scope["path"]):
            await self._serve(scope, receive, send)
        elif scope["type"] == "websocket" and NOTEBOOK_PATH.match(scope["path"]):
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                pool = self._pools.pop(asyncio.get_running_loop(), None)
                if pool is not None:
                    pool.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _pool(self) -> UpstreamPool:
        """Return this event loop's upstream connections (a connection belongs to one loop).

        The pool connects straight to the endpoint: no HTTP_PROXY from the
        environment ever sees a notebook's token.
        """
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._pools[loop] = UpstreamPool(connect_timeout=CONNECT_TIMEOUT, io_timeout=IO_TIMEOUT)
        return pool

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = NOTEBOOK_PATH.match(scope["path"])
        assert match is not None  # routed here only on a match
        target = await database_sync_to_async(authorize)(session_key(scope), int(match["workload"]))
        if scope["type"] == "websocket":
            await self._proxy_websocket(scope, receive, send, target)
        elif target is None:
            await _plain(send, 404, "Not found.")
        elif scope["method"] in _UNSAFE_METHODS and not same_site_origin(scope):
            await _plain(send, 403, "Cross-origin request refused.")
        else:
            await self._proxy_http(scope, receive, send, target)

    # --- HTTP ----------------------------------------------------------------------

    async def _proxy_http(self, scope: Scope, receive: Receive, send: Send, target: ProxyTarget) -> None:
        try:
            response = await self._pool().request(
                scope["method"],
                upstream_url(target.endpoint, scope),
                upstream_headers(scope, target, websocket=False),
                _request_body(receive) if _has_body(scope) else None,
            )
        except _ClientGone:
            return
        except UpstreamTimeout:
            logger.warning("notebook %s: the upstream did not answer in time", target.workload_id)
            await _plain(send, 504, "The notebook server did not answer in time.")
            return
        except UpstreamError as error:
            logger.warning("notebook %s: the upstream is unreachable (%s)", target.workload_id, error)
            await _plain(send, 502, "The notebook server cannot be reached.")
            return
        try:
            await self._stream_response(response, receive, send, target)
        finally:
            await response.aclose()

    async def _stream_response(
        self, response: UpstreamResponse, receive: Receive, send: Send, target: ProxyTarget
    ) -> None:
        """Relay the response as it comes; stop reading the upstream as soon as the browser disconnects."""
        await _first_of(self._relay_body(response, send, target), _until_disconnect(receive))

    async def _relay_body(self, response: UpstreamResponse, send: Send, target: ProxyTarget) -> None:
        mask = SecretMask(target.secret)
        headers = downstream_headers(response.headers, mask)
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        try:
            async for chunk in response.body():
                released = mask.feed(chunk)
                if released:
                    await send({"type": "http.response.body", "body": released, "more_body": True})
        except UpstreamError as error:
            # Headers are sent: leave the response incomplete so the browser sees a broken transfer.
            logger.warning("notebook %s: the upstream broke off (%s)", target.workload_id, error)
            return
        await send({"type": "http.response.body", "body": mask.flush()})

    # --- WebSocket -------------------------------------------------------------------

    async def _proxy_websocket(self, scope: Scope, receive: Receive, send: Send, target: ProxyTarget | None) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        if target is None:
            # Closing before accepting refuses the handshake (the server answers 403).
            await send({"type": "websocket.close", "code": 1008})
            return
        try:
            upstream = await connect(
                upstream_url(target.endpoint, scope, websocket=True),
                additional_headers=upstream_headers(scope, target, websocket=True),
                origin=_origin(target.endpoint),  # type: ignore[arg-type]  # Origin is a NewType of str
                subprotocols=scope.get("subprotocols") or None,
                compression=None,  # a loopback or LAN hop: deflate would only cost CPU
                open_timeout=CONNECT_TIMEOUT,
                max_size=MAX_MESSAGE_BYTES,
            )
        except (OSError, TimeoutError, InvalidHandshake) as error:
            logger.warning("notebook %s: no upstream WebSocket (%s)", target.workload_id, type(error).__name__)
            await send({"type": "websocket.close", "code": 1011})
            return
        async with upstream:
            await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
            browser = BrowserLeg(receive, send)
            await _first_of(
                _upstream_to_browser(upstream, browser, SecretMask(target.secret)),
                _browser_to_upstream(browser, upstream),
                _until_access_lost(session_key(scope), target, browser, upstream),
            )


class BrowserLeg:
    """The browser's side of a proxied WebSocket: closed at most once, and sent nothing once closed or gone.

    Both relay directions end at about the same time when either side
    closes: the server refuses any message after the browser's disconnect
    or after a close (uvicorn raises RuntimeError), so every send goes
    through here. Receiving the disconnect and marking the leg gone happen
    in one step of the receiving task, so no send can slip in between.
    """

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self.closed = False

    async def receive(self) -> Message:
        """Return the browser's next message; after its disconnect, the leg is closed."""
        message = await self._receive()
        if message["type"] == "websocket.disconnect":
            self.closed = True
        return message

    async def send(self, message: Message) -> None:
        """Send one frame message, unless the leg is closed; raises OSError when the browser is gone meanwhile."""
        if not self.closed:
            await self._send(message)

    async def close(self, code: int) -> None:
        """Close the browser's side with `code`, unless it is closed already."""
        if self.closed:
            return
        self.closed = True
        with suppress(OSError):  # the browser went away first (uvicorn's ClientDisconnected)
            await self._send({"type": "websocket.close", "code": code})


async def _access_changes(user_id: int) -> AsyncIterator[None]:
    """Yield each time `user_id`'s access may have changed, and every LIVE_RECHECK_SECONDS meanwhile.

    Listens to the user's access group on the live layer, as the live streams
    do; without a layer (or when it fails) the periodic re-check remains.
    """
    period = float(settings.LIVE_RECHECK_SECONDS)
    layer = get_channel_layer(LIVE_ALIAS)
    channel, group = None, access_group(user_id)
    if layer is not None:
        try:
            channel = await layer.new_channel()
            await layer.group_add(group, channel)
        except Exception as error:  # a layer outage costs promptness, never the connection
            logger.warning("notebook proxy: no access announcements (%r); re-checking every %.0f s", error, period)
            channel = None
    try:
        while True:
            if channel is None:
                await asyncio.sleep(period)
            else:
                with suppress(TimeoutError):
                    await asyncio.wait_for(layer.receive(channel), period)
            yield
    finally:
        if channel is not None and layer is not None:
            with suppress(Exception):
                await layer.group_discard(group, channel)


async def _until_access_lost(
    key: str | None, target: ProxyTarget, browser: BrowserLeg, upstream: ClientConnection
) -> None:
    """Re-check access whenever it may have changed; once lost, close the browser with 4403 and the upstream.

    The same check as every request's (`authorize`): a removed member, a
    deactivated tenant or user, or a logout ends an open kernel connection too.
    """
    async for _ in _access_changes(target.user_id):
        if await database_sync_to_async(authorize)(key, target.workload_id) is None:
            break
    await browser.close(REVOKED)
    await upstream.close()


async def _upstream_to_browser(upstream: ClientConnection, browser: BrowserLeg, mask: SecretMask) -> None:
    try:
        async for data in upstream:
            if isinstance(data, str):
                await browser.send({"type": "websocket.send", "text": mask.replace(data.encode()).decode()})
            else:
                await browser.send({"type": "websocket.send", "bytes": mask.replace(data)})
    except ConnectionClosed:
        pass
    except OSError:
        return  # the browser is gone (uvicorn's ClientDisconnected is an OSError): the other side closes upstream
    code = upstream.close_code
    await browser.close(_sendable(code, 1011 if code == 1006 else 1000))


async def _browser_to_upstream(browser: BrowserLeg, upstream: ClientConnection) -> None:
    while True:
        message = await browser.receive()
        if message["type"] == "websocket.disconnect":
            await upstream.close(code=_sendable(message.get("code")))
            return
        if message["type"] != "websocket.receive":
            continue
        text = message.get("text")
        try:
            await upstream.send(text if text is not None else message.get("bytes") or b"")
        except ConnectionClosed:
            return
