"""The proxy's WebSocket leg: a browser's connection relayed to the notebook's Jupyter server, frame by frame.

Text and binary frames go both ways until either side closes (the secret
masked on the way down); the close code passes on where it may be sent.
While the connection is open, access is asked again whenever it may have
changed, and its loss closes the browser's side with REVOKED.
"""

from __future__ import annotations

import logging
import re
from contextlib import suppress

from channels.db import database_sync_to_async
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from common.asgitypes import Message, Receive, Scope, Send
from jobs.proxy.access import _access_changes, authorize, notebook_cookie
from jobs.proxy.http import CONNECT_TIMEOUT, _first_of
from jobs.proxy.rewrite import SecretMask, _origin, upstream_headers, upstream_url
from jobs.selectors import ProxyTarget

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest WebSocket message relayed from the upstream (kernel outputs may carry images)."""
REVOKED = 4403
"""The code the browser's WebSocket closes with when its user loses access to the notebook, as the live streams'."""
_SENDABLE_CLOSE = re.compile(r"^(100[0-3]|10(0[7-9]|1[0-4])|[34][0-9]{3})$")


def _sendable(code: int | None, fallback: int = 1000) -> int:
    """Return `code` if it may be sent in a close frame (1005 and 1006 only describe one), else `fallback`."""
    return code if code is not None and _SENDABLE_CLOSE.match(str(code)) else fallback


async def proxy_websocket(scope: Scope, receive: Receive, send: Send, target: ProxyTarget | None) -> None:
    """Accept the browser's connection and relay it to `target`; refuse the handshake when `target` is None."""
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
            _until_access_lost(notebook_cookie(scope), target, browser, upstream),
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


async def _until_access_lost(
    cookie: str | None, target: ProxyTarget, browser: BrowserLeg, upstream: ClientConnection
) -> None:
    """Re-check access whenever it may have changed; once lost, close the browser with 4403 and the upstream.

    The same check as every request's (`authorize`): a removed member, a
    deactivated tenant or user, or a logout ends an open kernel connection too.
    """
    async for _ in _access_changes(target.user_id):
        if await database_sync_to_async(authorize)(cookie, target.workload_id) is None:
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
