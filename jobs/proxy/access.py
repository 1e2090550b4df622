"""Who may reach a notebook through the proxy, asked again for every request and while a WebSocket stays open.

The proxy serves notebooks on their own origin (`settings.NOTEBOOK_ORIGIN`),
where the console's session cookie is no login: a browser enters with the
notebook origin's own cookie (`jobs.services.notebook_entry`), which stands
for a user, a notebook and the console session it was issued under. Anyone
without access gets the same answer as for a notebook that does not exist:
`authorize` returns None for both. Unsafe methods and WebSocket connects
must also come from the notebook's own origin, scheme, host and port alike
(`from_notebook_origin`), since the session token lets the upstream skip
Jupyter's own XSRF check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import suppress
from importlib import import_module

from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user
from django.http import HttpRequest, parse_cookie
from django.http.request import validate_host

from common.asgitypes import Scope
from common.live_layer import LIVE_ALIAS, access_group
from common.origins import parse_origin, same_origin
from jobs.selectors import ProxyTarget, notebook_proxy_target
from jobs.services.notebook_entry import notebook_entry

logger = logging.getLogger(__name__)


def header(scope: Scope, name: bytes) -> list[str]:
    """Return every value of request header `name` (lower-case), in order."""
    return [value.decode("latin-1") for key, value in scope.get("headers") or [] if key.lower() == name]


def notebook_cookie(scope: Scope) -> str | None:
    """Return the notebook origin's cookie from the request's Cookie headers, or None.

    Its path is the notebook's own, so a browser sends at most the one of the notebook asked for.
    """
    return parse_cookie("; ".join(header(scope, b"cookie"))).get(settings.NOTEBOOK_COOKIE_NAME) or None


def authorize(cookie: str | None, workload_id: int) -> ProxyTarget | None:
    """Return where the holder of notebook cookie `cookie` reaches notebook `workload_id`, or None.

    The cookie must have been issued for this notebook; the console session
    it was issued under must still sign its user in (Django's own session
    store and `get_user`, which also checks the session against the user's
    password hash); then the selector, the one rule the console's hand-off
    asked too. One call, so the proxy crosses to a database thread once per
    request.
    """
    entry = notebook_entry(cookie, workload_id)
    if entry is None:
        return None
    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(entry.console_session)
    user = get_user(request)
    if user.pk != entry.user_id:
        return None
    return notebook_proxy_target(user, workload_id)


def _allowed_hosts() -> list[str]:
    # Django's own fallback when DEBUG runs with no ALLOWED_HOSTS (see HttpRequest.get_host).
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [".localhost", "127.0.0.1", "[::1]"]
    return list(settings.ALLOWED_HOSTS)


def _server_address(scope: Scope) -> list[str]:
    # A request without a Host header (none over HTTP/1.1 from a browser) was sent to where the server listens.
    server = scope.get("server")
    if not server or server[1] is None:
        return []
    host = f"[{server[0]}]" if ":" in server[0] else server[0]
    return [f"{host}:{server[1]}"]


def same_site_origin(scope: Scope) -> bool:
    """Return True when the request's one Origin header is the console's own origin: scheme, host and port.

    That is the origin the request itself was sent to (its Host header, on
    one of the console's allowed hosts, over https when the console is),
    never the notebook origin: on one machine the two differ only in the
    port, and a browser sends the console's cookies to both.
    """
    origins, hosts = header(scope, b"origin"), header(scope, b"host") or _server_address(scope)
    if len(origins) != 1 or len(hosts) != 1:
        return False
    secure = settings.HTTPS or scope.get("scheme") in ("https", "wss")
    console = parse_origin(f"{'https' if secure else 'http'}://{hosts[0]}")
    pattern = settings.NOTEBOOK_ORIGIN
    if console is None or (pattern is not None and pattern.serves(console.netloc)):
        return False
    return same_origin(origins[0], console) and validate_host(console.host, _allowed_hosts())


def from_notebook_origin(scope: Scope, workload_id: int) -> bool:
    """Return True when the request's one Origin header is notebook `workload_id`'s origin: scheme, host and port."""
    origins = header(scope, b"origin")
    pattern = settings.NOTEBOOK_ORIGIN
    return pattern is not None and len(origins) == 1 and same_origin(origins[0], pattern.origin_of(workload_id))


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
