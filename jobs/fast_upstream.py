"""A lean streaming HTTP/1.1 client for the notebook proxy's upstream leg.

The proxy relays a notebook's HTTP traffic byte for byte to one known
server on a local network, so it needs only a small part of what a
general client does: one request at a time per connection, keep-alive
reuse, bounded waits, and a body that streams in the chunks the socket
delivers. httpx did the job, but its layers (httpcore over anyio, 64 KiB
reads, an async generator per layer) cost more CPU per byte than the
download itself, and the proxy is CPU-bound on a busy console. Here h11
parses the heads and any chunked body (the same parser uvicorn and httpcore
use), a body of declared length passes straight through, and a small asyncio
protocol hands over the chunks the socket delivers without copying them.

A fast path (docs/fastpaths.md): `GPUCLOUD_FAST_PATHS_OFF=proxy_client`
turns it off, and `jobs.upstream_httpx` (httpx) serves instead. Justified
by `bench/proxy.py` (download throughput through the proxy against
straight from Jupyter). It depends on these library internals: h11's
event API and `trailing_data` (a body of declared length is read past
h11, whose state is then reset), asyncio's Protocol/transport flow control.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import h11

from jobs.upstream import MAX_IDLE_PER_HOST, UpstreamError, UpstreamTimeout

READ_BYTES = 1024 * 1024
"""The most one socket read takes: large reads are what makes a download cheap."""


class _Stream(asyncio.Protocol):
    """One upstream socket: received chunks are queued as the transport delivers them (no copy), writes drain.

    asyncio's StreamReader copies every chunk into its buffer and out again;
    a relay only needs the chunks in order. Reading pauses while more than
    HIGH_WATER bytes wait, so a slow browser holds back the upstream.
    """

    HIGH_WATER = 4 * READ_BYTES

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._ended = False
        self._error: BaseException | None = None
        self._readable: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._reading_paused = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection's transport

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > self.HIGH_WATER and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._ended = True
        self._wake_reader()
        return False  # close the transport: HTTP/1.1 has no use for a half-open connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended, self._error = True, exc
        self._wake_reader()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def _wake_reader(self) -> None:
        if self._readable is not None and not self._readable.done():
            self._readable.set_result(None)

    async def read(self, limit: int) -> bytes:
        """Return the next chunk received (at most `limit` bytes); b"" once the stream ended; raises OSError."""
        while not self._chunks:
            if self._ended:
                if self._error is not None:
                    raise OSError(str(self._error)) from self._error
                return b""
            self._readable = self._loop.create_future()
            await self._readable
        chunk = self._chunks.popleft()
        if len(chunk) > limit:
            self._chunks.appendleft(chunk[limit:])
            chunk = chunk[:limit]
        self._buffered -= len(chunk)
        if self._reading_paused and self._buffered <= self.HIGH_WATER // 2 and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return chunk

    def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise OSError("the upstream connection is closed")
        self.transport.write(data)

    async def drain(self) -> None:
        """Return once the transport takes more data; raises OSError when the connection is gone."""
        if self._writable is not None and not self._writable.done():
            await self._writable
        if self._ended and self._error is not None:
            raise OSError(str(self._error))

    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing() and not self._ended


@dataclass
class _Connection:
    stream: _Stream
    http: h11.Connection = field(default_factory=lambda: h11.Connection(our_role=h11.CLIENT))

    def reusable(self) -> bool:
        # Leftover bytes between responses mean the server broke framing: never reuse such a connection.
        return self.stream.usable() and not self.stream._chunks

    def close(self) -> None:
        if self.stream.transport is not None:
            self.stream.transport.close()


class UpstreamResponse:
    """A response whose head has arrived; iterate `body()` once for the rest, then `aclose()`."""

    def __init__(
        self, pool: UpstreamPool, key: tuple[str, int], connection: _Connection, head: h11.Response, method: str
    ) -> None:
        self.status = head.status_code
        self.headers: list[tuple[bytes, bytes]] = [(bytes(k), bytes(v)) for k, v in head.headers]
        self._pool, self._key, self._connection = pool, key, connection
        self._length = _plain_length(head, method)
        self._done = False

    async def body(self) -> AsyncIterator[bytes]:
        """Yield the body in the chunks the socket delivers; raises UpstreamError or UpstreamTimeout."""
        if self._length is not None:
            async for chunk in self._counted(self._length):
                yield chunk
            return
        while True:
            event = await self._pool.next_event(self._connection)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._done = True
                return

    async def _counted(self, length: int) -> AsyncIterator[bytes]:
        """Yield exactly `length` bytes straight from the socket, past h11.

        A body of declared length needs no parsing, and copying every chunk
        through h11's buffer costs about as much as the rest of the relay.
        What h11 already buffered past the head comes first.
        """
        buffered, _ = self._connection.http.trailing_data
        if len(buffered) > length:
            raise UpstreamError("the upstream sent more than the response's Content-Length")
        if buffered:
            yield bytes(buffered)
        left = length - len(buffered)
        while left:
            chunk = await self._pool.read(self._connection, left)
            if not chunk:
                raise UpstreamError("the upstream closed the connection mid-body")
            left -= len(chunk)
            yield chunk
        self._done = True

    async def aclose(self) -> None:
        """Give the connection back for reuse when the exchange completed cleanly, else close it."""
        connection, self._connection = self._connection, None  # type: ignore[assignment]
        if connection is not None:
            self._pool.release(self._key, connection, reusable=self._done, bypassed=self._length is not None)


def _plain_length(head: h11.Response, method: str) -> int | None:
    """Return the body length a keep-alive HTTP/1.1 response declares with Content-Length alone, else None.

    None sends the body through h11: chunked or close-delimited bodies,
    and responses that have no body whatever their headers say.
    """
    if method == "HEAD" or head.status_code in (204, 304) or head.http_version != b"1.1":
        return None
    lengths = [value for name, value in head.headers if name == b"content-length"]
    encodings = [value for name, value in head.headers if name == b"transfer-encoding"]
    closing = any(b"close" in value.lower() for name, value in head.headers if name == b"connection")
    if len(lengths) != 1 or encodings or closing or not lengths[0].isdigit():
        return None
    return int(lengths[0])


class UpstreamPool:
    """Kept-alive connections to upstream servers, for one event loop. Not thread-safe (nor needs to be)."""

    def __init__(self, *, connect_timeout: float, io_timeout: float) -> None:
        self.connect_timeout, self.io_timeout = connect_timeout, io_timeout
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: AsyncIterator[bytes] | None
    ) -> UpstreamResponse:
        """Send the request (streaming `body`, when given) and return once the response head arrived.

        `url` is http://host:port/path?query. Raises UpstreamTimeout or
        UpstreamError. A kept-alive connection the server closed meanwhile
        is retried once on a fresh one, when no body was sent.
        """
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise UpstreamError(f"not an http:// URL: {url!r}")
        key = (parts.hostname, parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = h11.Request(method=method, target=target, headers=_with_framing(headers, parts.netloc, body))
        connection, reused = await self._acquire(key)
        try:
            return await self._exchange(key, connection, head, body)
        except UpstreamError:
            connection.close()
            if not reused or body is not None:
                raise
        connection, _ = await self._fresh(key), False
        try:
            return await self._exchange(key, connection, head, None)
        except UpstreamError:
            connection.close()
            raise

    async def _exchange(
        self, key: tuple[str, int], connection: _Connection, head: h11.Request, body: AsyncIterator[bytes] | None
    ) -> UpstreamResponse:
        try:
            connection.stream.write(connection.http.send(head) or b"")
            if body is not None:
                async for chunk in body:
                    connection.stream.write(connection.http.send(h11.Data(data=chunk)) or b"")
                    await self._drain(connection)
            connection.stream.write(connection.http.send(h11.EndOfMessage()) or b"")
            await self._drain(connection)
        except h11.LocalProtocolError as error:
            raise UpstreamError(f"cannot send the request: {error}") from error
        except OSError as error:
            raise UpstreamError(f"writing to the upstream failed: {error}") from error
        while True:
            event = await self.next_event(connection)
            if isinstance(event, h11.Response):
                return UpstreamResponse(self, key, connection, event, head.method.decode())

    async def next_event(self, connection: _Connection) -> h11.Event:
        """Return the connection's next HTTP event, reading the socket as needed."""
        while True:
            try:
                event = connection.http.next_event()
            except h11.RemoteProtocolError as error:
                raise UpstreamError(f"the upstream broke HTTP: {error}") from error
            if event is h11.NEED_DATA:
                connection.http.receive_data(await self.read(connection))
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise UpstreamError("the upstream closed the connection")
            if isinstance(event, h11.InformationalResponse):
                continue  # 100 Continue and the like: the final response follows
            return event  # type: ignore[return-value]  # NEED_DATA and PAUSED are handled above

    async def read(self, connection: _Connection, limit: int = READ_BYTES) -> bytes:
        """Return what the socket holds (up to `limit` bytes, at least one; b"" at its end)."""
        try:
            async with asyncio.timeout(self.io_timeout):
                return await connection.stream.read(min(limit, READ_BYTES))
        except TimeoutError as error:
            raise UpstreamTimeout("the upstream stayed silent") from error
        except OSError as error:
            raise UpstreamError(f"reading from the upstream failed: {error}") from error

    async def _drain(self, connection: _Connection) -> None:
        try:
            async with asyncio.timeout(self.io_timeout):
                await connection.stream.drain()
        except TimeoutError as error:
            raise UpstreamTimeout("the upstream does not take the request") from error
        except OSError as error:
            raise UpstreamError(f"writing to the upstream failed: {error}") from error

    async def _acquire(self, key: tuple[str, int]) -> tuple[_Connection, bool]:
        idle = self._idle.get(key) or []
        while idle:
            connection = idle.pop()
            if connection.reusable():
                return connection, True
            connection.close()
        return await self._fresh(key), False

    async def _fresh(self, key: tuple[str, int]) -> _Connection:
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, stream = await asyncio.get_running_loop().create_connection(_Stream, *key)
        except TimeoutError as error:
            raise UpstreamTimeout(f"connecting to {key[0]}:{key[1]} timed out") from error
        except OSError as error:
            raise UpstreamError(f"cannot connect to {key[0]}:{key[1]}: {error}") from error
        return _Connection(stream)

    def release(self, key: tuple[str, int], connection: _Connection, *, reusable: bool, bypassed: bool) -> None:
        """Keep `connection` for the next request to `key` if the exchange ended cleanly, else close it.

        `bypassed`: the body was read past h11 (see `UpstreamResponse._counted`), so h11 still
        waits for it; the stream sits at a message boundary and gets a fresh h11 state.
        """
        http = connection.http
        if reusable and bypassed and http.our_state is h11.DONE and connection.reusable():
            connection.http = h11.Connection(our_role=h11.CLIENT)
        elif reusable and http.our_state is h11.DONE and http.their_state is h11.DONE and connection.reusable():
            http.start_next_cycle()
        else:
            connection.close()
            return
        idle = self._idle.setdefault(key, [])
        if len(idle) < MAX_IDLE_PER_HOST:
            idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


def _with_framing(
    headers: list[tuple[str, str]], netloc: str, body: AsyncIterator[bytes] | None
) -> list[tuple[str, str]]:
    """Return `headers` with Host, and with chunked framing for a body whose length is not declared."""
    names = {name.lower() for name, _ in headers}
    framed = [("host", netloc), *headers] if "host" not in names else list(headers)
    if body is not None and "content-length" not in names:
        framed.append(("transfer-encoding", "chunked"))
    return framed
