"""The notebook proxy's upstream leg through httpx: the framework's path that `jobs.fast_upstream` replaces.

Serves when the fast path `proxy_client` is off (`GPUCLOUD_FAST_PATHS_OFF=proxy_client`,
docs/fastpaths.md), keeping the contract of `jobs.upstream` as the lean
client does: the same request and answer shapes, the same errors (UpstreamTimeout for a connect
or a silence past its limit, UpstreamError for anything else), keep-alive
reuse, and a body streamed as it arrives, never decoded. Requests are
built as `httpx.Request`s and sent as they are, so the client's default
headers (User-Agent, Accept-Encoding) never reach the notebook, and
`trust_env=False` keeps any HTTP_PROXY from seeing a notebook's token.
tests/jobs/test_upstream.py holds both clients to the same scripted servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import httpx

from jobs.upstream import MAX_IDLE_PER_HOST, UpstreamError, UpstreamTimeout


class HttpxUpstreamResponse:
    """A response whose head has arrived; iterate `body()` once for the rest, then `aclose()`."""

    def __init__(self, response: httpx.Response) -> None:
        self.status = response.status_code
        # Lower-cased names, as h11 gives them to the fast path's callers.
        self.headers: list[tuple[bytes, bytes]] = [(name.lower(), value) for name, value in response.headers.raw]
        self._response = response

    async def body(self) -> AsyncIterator[bytes]:
        """Yield the body as the upstream sends it (undecoded); raises UpstreamError or UpstreamTimeout."""
        with _translated():
            async for chunk in self._response.aiter_raw():
                yield chunk

    async def aclose(self) -> None:
        """Give the connection back to the pool (httpcore keeps it only when the exchange completed)."""
        await self._response.aclose()


class HttpxUpstreamPool:
    """Kept-alive connections to upstream servers through one `httpx.AsyncClient`, for one event loop."""

    def __init__(self, *, connect_timeout: float, io_timeout: float) -> None:
        self._client = httpx.AsyncClient(
            trust_env=False,
            timeout=httpx.Timeout(io_timeout, connect=connect_timeout, pool=connect_timeout),
            # No cap on connections, as the fast path has none; idle ones kept (for all hosts together).
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=MAX_IDLE_PER_HOST),
        )
        self._closing: set[asyncio.Task[None]] = set()

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: AsyncIterator[bytes] | None
    ) -> HttpxUpstreamResponse:
        """Send the request (streaming `body`, when given) and return once the response head arrived."""
        if not url.startswith("http://"):
            raise UpstreamError(f"not an http:// URL: {url!r}")
        with _translated():
            request = httpx.Request(method, url, headers=headers, content=body)
            return HttpxUpstreamResponse(await self._client.send(request, stream=True))

    def close(self) -> None:
        """Close every idle connection: the client closes on the running loop (there is one at shutdown)."""
        task = asyncio.get_running_loop().create_task(self._client.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)


@contextmanager
def _translated() -> Iterator[None]:
    """Turn httpx's errors into the proxy's: timeouts into UpstreamTimeout, the rest into UpstreamError."""
    try:
        yield
    except httpx.TimeoutException as error:
        raise UpstreamTimeout(f"the upstream did not answer in time: {error!r}") from error
    except (httpx.HTTPError, httpx.StreamError, httpx.InvalidURL) as error:
        raise UpstreamError(f"the upstream failed: {error!r}") from error
