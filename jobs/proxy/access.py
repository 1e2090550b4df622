"""Who may reach a notebook through the proxy, asked again for every request and while a WebSocket stays open.

Anyone without access gets the same answer as for a notebook that does not
exist: `authorize` returns None for both. Unsafe methods and WebSocket
connects must also come from one of the console's own origins
(`same_site_origin`), since the session token lets the upstream skip
Jupyter's own XSRF check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import suppress
from importlib import import_module
from urllib.parse import urlsplit

from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user
from django.http import HttpRequest, parse_cookie
from django.http.request import validate_host

from common.asgitypes import Scope
from common.live_layer import LIVE_ALIAS, access_group
from jobs.selectors import ProxyTarget, notebook_proxy_target

logger = logging.getLogger(__name__)


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
