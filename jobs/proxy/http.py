"""The proxy's HTTP leg: one request up to the notebook's Jupyter server, its response streamed back down.

The request body streams up as the browser sends it; the response streams
down as the upstream sends it, the session secret masked, and reading the
upstream stops as soon as the browser disconnects. An upstream that cannot
be reached or does not answer in time gets a plain 502 or 504; one that
breaks off mid-body leaves the response incomplete.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable

from common.asgitypes import Receive, Scope, Send
from jobs.proxy.rewrite import SecretMask, downstream_headers, upstream_headers, upstream_url
from jobs.selectors import ProxyTarget
from jobs.upstream import Upstream, UpstreamAnswer, UpstreamError, UpstreamTimeout

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
"""Seconds to reach the notebook's server (a local network hop; more means it is down)."""
IO_TIMEOUT = 120.0
"""Seconds the upstream may stay silent mid-request (a long save or a large conversion)."""


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


async def proxy_http(pool: Upstream, scope: Scope, receive: Receive, send: Send, target: ProxyTarget) -> None:
    """Forward the request to `target` through `pool` and relay the response; the caller has checked access."""
    try:
        response = await pool.request(
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
        await _stream_response(response, receive, send, target)
    finally:
        await response.aclose()


async def _stream_response(response: UpstreamAnswer, receive: Receive, send: Send, target: ProxyTarget) -> None:
    """Relay the response as it comes; stop reading the upstream as soon as the browser disconnects."""
    await _first_of(_relay_body(response, send, target), _until_disconnect(receive))


async def _relay_body(response: UpstreamAnswer, send: Send, target: ProxyTarget) -> None:
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
