"""The notebook proxy: `/notebooks/<workload id>/...` over HTTP and WebSocket, on the notebooks' own origin.

A raw ASGI app in front of the console's own apps (`gpucloud/asgi.py`).
Requests whose Host is the notebook origin (`settings.NOTEBOOK_ORIGIN`:
one apps host, a host per notebook, or on one machine the next port) are
its own; every other request goes to the console's apps untouched, and
the console answers `/notebooks/<id>/...` with the hand-off
(`jobs.views`), never with a notebook. On the notebook origin it

1. redeems a hand-off ticket at `/notebooks/<id>/gpucloud-enter?ticket=`
   (`jobs.services.notebook_entry`): once, within seconds, for that
   notebook only; it sets the origin's own cookie (HttpOnly, SameSite=Lax,
   Secure over https, path `/notebooks/<id>/`) and sends the browser on;
2. authenticates that cookie (the user, notebook and console session it
   stands for) and asks `jobs.selectors.notebook_proxy_target`, both in one
   hop to a database thread, on every request and every WebSocket connect,
   so revoked access ends at once. Anyone without access gets the same 404
   (HTTP) or refused handshake (WebSocket) as for a notebook that does not
   exist. An open WebSocket asks again whenever its user's access may have
   changed (the live streams' announcements) and every
   LIVE_RECHECK_SECONDS, and closes with 4403 once access is gone;
3. forwards the request to the same path and query on the endpoint of the
   notebook's first replica (Jupyter runs with `base_url=/notebooks/<id>/`),
   adding `Authorization: token <session secret>` and dropping every
   credential (the console's cookies, should a browser send them, and the
   notebook cookie), any incoming `Authorization`, hop-by-hop headers;
   Host and Origin become the upstream's own, so Jupyter's origin checks
   pass;
4. streams both ways: request bodies up, response bodies and WebSocket
   frames (text and binary) down, until either side closes.

Anything else on the notebook origin (console pages, the API, static
files, another notebook's path on a per-notebook host) is a 404.

The session secret never reaches the browser: Jupyter's login cookie is
not passed on (the proxy authenticates every request itself), and any
occurrence of the secret in response headers, bodies and frames is masked
with asterisks of the same length (JupyterLab writes its token into its
pages). Masking needs plain bytes, so the upstream is asked for identity
encoding (jupyter_server compresses nothing anyway).

Because the token authenticates every upstream request, Jupyter skips its
own XSRF check: unsafe methods and WebSocket connects must therefore carry
an Origin that is the notebook's own origin, scheme, host and port alike.

This package's `NotebookProxy` routes and checks access; the legs are
`jobs.proxy.http` and `jobs.proxy.websocket`, the access checks
`jobs.proxy.access`, and what changes on the way (headers, URL, the
secret's mask) `jobs.proxy.rewrite`.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.conf import settings

from common import fastpaths
from common.asgitypes import ASGIApp, Receive, Scope, Send
from jobs.fast_upstream import UpstreamPool
from jobs.proxy.access import authorize, from_notebook_origin, header, notebook_cookie, same_site_origin
from jobs.proxy.http import CONNECT_TIMEOUT, IO_TIMEOUT, _plain, proxy_http
from jobs.proxy.rewrite import SecretMask, downstream_headers, upstream_headers, upstream_url
from jobs.proxy.websocket import MAX_MESSAGE_BYTES, REVOKED, BrowserLeg, proxy_websocket
from jobs.services.notebook_entry import ENTRY, redeem_ticket
from jobs.upstream import Upstream
from jobs.upstream_httpx import HttpxUpstreamPool

__all__ = [
    "CONNECT_TIMEOUT",
    "IO_TIMEOUT",
    "MAX_MESSAGE_BYTES",
    "NOTEBOOK_PATH",
    "REVOKED",
    "ASGIApp",
    "BrowserLeg",
    "NotebookProxy",
    "Receive",
    "Scope",
    "SecretMask",
    "Send",
    "authorize",
    "downstream_headers",
    "from_notebook_origin",
    "notebook_cookie",
    "same_site_origin",
    "upstream_headers",
    "upstream_url",
]

NOTEBOOK_PATH = re.compile(r"^/notebooks/(?P<workload>[1-9][0-9]{0,17})/")
"""The paths the proxy serves; the id is bounded so it always fits a database integer."""

_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class NotebookProxy:
    """ASGI app: serves the notebook origin (HTTP and WebSocket) itself and hands every other request to `app`.

    It also answers the lifespan protocol (closing its upstream connections
    at shutdown), which the console's router does not speak.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Upstream] = weakref.WeakKeyDictionary()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] in ("http", "websocket") and on_notebook_origin(scope):
            await self._notebook_origin(scope, receive, send)
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

    def _pool(self) -> Upstream:
        """Return this event loop's upstream connections (a connection belongs to one loop).

        The pool connects straight to the endpoint: no HTTP_PROXY from the
        environment ever sees a notebook's token.
        """
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._pools[loop] = upstream_pool(connect_timeout=CONNECT_TIMEOUT, io_timeout=IO_TIMEOUT)
        return pool

    async def _notebook_origin(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a request to the notebook origin: a notebook's entry or its proxied path, else 404."""
        match = NOTEBOOK_PATH.match(scope["path"])
        workload_id = int(match["workload"]) if match else None
        if workload_id is None or not on_notebook_origin(scope, workload_id):
            await _refuse(scope, receive, send)
        elif scope["type"] == "http" and scope["path"] == f"/notebooks/{workload_id}/{ENTRY}":
            await _enter(scope, send, workload_id)
        else:
            await self._serve(scope, receive, send, workload_id)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, workload_id: int) -> None:
        target = await database_sync_to_async(authorize)(notebook_cookie(scope), workload_id)
        if scope["type"] == "websocket":
            allowed = target is not None and from_notebook_origin(scope, workload_id)
            await proxy_websocket(scope, receive, send, target if allowed else None)
        elif target is None:
            await _plain(send, 404, "Not found.")
        elif scope["method"] in _UNSAFE_METHODS and not from_notebook_origin(scope, workload_id):
            await _plain(send, 403, "Cross-origin request refused.")
        else:
            await proxy_http(self._pool(), scope, receive, send, target)


def upstream_pool(*, connect_timeout: float, io_timeout: float) -> Upstream:
    """Return a new upstream client: the lean one (`jobs.fast_upstream`), or httpx with `proxy_client` off."""
    if fastpaths.enabled(fastpaths.PROXY_CLIENT):
        return UpstreamPool(connect_timeout=connect_timeout, io_timeout=io_timeout)
    return HttpxUpstreamPool(connect_timeout=connect_timeout, io_timeout=io_timeout)


def on_notebook_origin(scope: Scope, workload_id: int | None = None) -> bool:
    """Return whether the request's Host is the notebook origin (per notebook: `workload_id`'s, when given)."""
    pattern = settings.NOTEBOOK_ORIGIN
    hosts = header(scope, b"host")
    return pattern is not None and len(hosts) == 1 and pattern.serves(hosts[0], workload_id)


async def _refuse(scope: Scope, receive: Receive, send: Send) -> None:
    """Answer what the notebook origin does not serve: 404, or a refused handshake."""
    if scope["type"] == "websocket":
        await receive()  # the connect
        await send({"type": "websocket.close", "code": 1008})
    else:
        await _plain(send, 404, "Not found.")


def _cookie(workload_id: int, value: str) -> bytes:
    """Return the notebook cookie's Set-Cookie value: host-only, this notebook's path, never readable by scripts."""
    pattern = settings.NOTEBOOK_ORIGIN
    secure = "; Secure" if pattern is not None and pattern.scheme == "https" else ""
    return (
        f"{settings.NOTEBOOK_COOKIE_NAME}={value}; Path=/notebooks/{workload_id}/; "
        f"Max-Age={settings.SESSION_COOKIE_AGE}; HttpOnly; SameSite=Lax{secure}"
    ).encode()


async def _enter(scope: Scope, send: Send, workload_id: int) -> None:
    """Redeem the hand-off ticket in the query: set the notebook cookie and go on, or 404 when it is spent."""
    tickets = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("ticket") or [""]
    redeemed = None
    if scope["method"] == "GET":
        redeemed = await database_sync_to_async(redeem_ticket)(tickets[0], workload_id=workload_id)
    if redeemed is None:
        await _plain(send, 404, "This link has expired or was used already: open the notebook again from the console.")
        return
    cookie, path = redeemed
    headers = [
        (b"location", f"/notebooks/{workload_id}/{path}".encode()),
        (b"set-cookie", _cookie(workload_id, cookie)),
        (b"cache-control", b"no-store"),
        (b"referrer-policy", b"no-referrer"),  # the ticket in this URL is spent, but it need not travel
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
