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

This package's `NotebookProxy` routes and checks access; the legs are
`jobs.proxy.http` and `jobs.proxy.websocket`, the access checks
`jobs.proxy.access`, and what changes on the way (headers, URL, the
secret's mask) `jobs.proxy.rewrite`.
"""

from __future__ import annotations

import asyncio
import re
import weakref

from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator

from common.asgitypes import ASGIApp, Receive, Scope, Send
from jobs.proxy.access import authorize, same_site_origin, session_key
from jobs.proxy.http import CONNECT_TIMEOUT, IO_TIMEOUT, _plain, proxy_http
from jobs.proxy.rewrite import SecretMask, downstream_headers, upstream_headers, upstream_url
from jobs.proxy.websocket import MAX_MESSAGE_BYTES, REVOKED, BrowserLeg, proxy_websocket
from jobs.upstream import UpstreamPool

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
    "same_site_origin",
    "session_key",
    "upstream_headers",
    "upstream_url",
]

NOTEBOOK_PATH = re.compile(r"^/notebooks/(?P<workload>[1-9][0-9]{0,17})/")
"""The paths the proxy serves; the id is bounded so it always fits a database integer."""

_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


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
            await proxy_websocket(scope, receive, send, target)
        elif target is None:
            await _plain(send, 404, "Not found.")
        elif scope["method"] in _UNSAFE_METHODS and not same_site_origin(scope):
            await _plain(send, 403, "Cross-origin request refused.")
        else:
            await proxy_http(self._pool(), scope, receive, send, target)
