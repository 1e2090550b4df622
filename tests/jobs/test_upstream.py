"""The proxy's upstream client against scripted HTTP servers on loopback: framing, reuse, failures, back-pressure.

Every test runs with the fast path `proxy_client` on (`jobs.fast_upstream`, the lean h11 client) and off
(`jobs.upstream_httpx`, httpx): both clients keep the same contract.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from common import fastpaths
from jobs.fast_upstream import UpstreamPool
from jobs.proxy import upstream_pool
from jobs.upstream import Upstream, UpstreamAnswer, UpstreamError, UpstreamTimeout
from jobs.upstream_httpx import HttpxUpstreamPool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(autouse=True, params=[True, False], ids=["lean", "httpx"])
def proxy_client(request: pytest.FixtureRequest, settings: Any) -> bool:
    """The fast path's switch (common.fastpaths), on then off, for every test here."""
    settings.FAST_PATHS = {**settings.FAST_PATHS, fastpaths.PROXY_CLIENT: request.param}
    return bool(request.param)


async def _head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def _serve(handler: Handler, body: Callable[[Upstream, str], Awaitable[None]]) -> list[int]:
    """Run `handler` as a server, call `body(pool, base_url)`; return how many connections the server accepted."""
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = upstream_pool(connect_timeout=2, io_timeout=1)
    try:
        await body(pool, f"http://127.0.0.1:{port}")
    finally:
        pool.close()
        server.close()
    return accepted


async def _read_all(response: UpstreamAnswer) -> bytes:
    try:
        return b"".join([chunk async for chunk in response.body()])
    finally:
        await response.aclose()


def _run(coroutine: Awaitable[list[int]]) -> list[int]:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def test_a_body_of_declared_length_arrives_whole_and_the_connection_is_reused() -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB: several socket reads

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):
            await _head(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
            await writer.drain()

    async def body(pool: Upstream, base: str) -> None:
        for _ in range(2):
            response = await pool.request("GET", f"{base}/files/big", [], None)
            assert response.status == 200
            assert await _read_all(response) == payload

    assert len(_run(_serve(handler, body))) == 1


def test_a_chunked_body_goes_through_the_parser_and_the_connection_is_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):
            await _head(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
            await writer.drain()

    async def body(pool: Upstream, base: str) -> None:
        for _ in range(2):
            assert await _read_all(await pool.request("GET", f"{base}/x", [], None)) == b"hello world"

    assert len(_run(_serve(handler, body))) == 1


def test_head_and_no_content_answers_have_no_body() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        await _head(reader)
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()

    async def body(pool: Upstream, base: str) -> None:
        assert await _read_all(await pool.request("HEAD", f"{base}/x", [], None)) == b""
        assert await _read_all(await pool.request("DELETE", f"{base}/x", [], None)) == b""

    assert len(_run(_serve(handler, body))) == 1


def test_a_request_body_streams_up_with_chunked_framing_when_its_length_is_unknown() -> None:
    received: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await _head(reader)
        assert b"transfer-encoding: chunked" in head.lower()
        received.append(await reader.readuntil(b"0\r\n\r\n"))
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    async def upload() -> AsyncIterator[bytes]:
        yield b"abc"
        yield b"defg"

    async def body(pool: Upstream, base: str) -> None:
        response = await pool.request("PUT", f"{base}/x", [("content-type", "text/plain")], upload())
        assert response.status == 201
        assert await _read_all(response) == b"ok"

    _run(_serve(handler, body))
    assert received == [b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"]


def test_a_kept_alive_connection_the_server_closed_is_replaced_for_a_bodiless_request() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
        await writer.drain()
        # then the server drops the idle connection without a word

    async def body(pool: Upstream, base: str) -> None:
        assert await _read_all(await pool.request("GET", f"{base}/a", [], None)) == b"hi"
        await asyncio.sleep(0.1)
        assert await _read_all(await pool.request("GET", f"{base}/b", [], None)) == b"hi"

    assert len(_run(_serve(handler, body))) == 2


def test_a_body_cut_short_is_an_error_and_the_connection_is_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await writer.drain()
        writer.close()

    async def body(pool: Upstream, base: str) -> None:
        response = await pool.request("GET", f"{base}/x", [], None)
        with pytest.raises(UpstreamError):
            await _read_all(response)

    _run(_serve(handler, body))


def test_a_silent_upstream_times_out_and_an_absent_one_is_unreachable() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        await asyncio.sleep(5)

    async def body(pool: Upstream, base: str) -> None:
        with pytest.raises(UpstreamTimeout):
            await pool.request("GET", f"{base}/x", [], None)

    _run(_serve(handler, body))

    async def nowhere() -> list[int]:
        pool = upstream_pool(connect_timeout=2, io_timeout=1)
        with pytest.raises(UpstreamError):
            await pool.request("GET", "http://127.0.0.1:9/x", [], None)
        return []

    _run(nowhere())


def test_garbage_from_the_upstream_is_an_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()

    async def body(pool: Upstream, base: str) -> None:
        with pytest.raises(UpstreamError):
            await pool.request("GET", f"{base}/x", [], None)

    _run(_serve(handler, body))


def test_a_slow_reader_holds_back_the_upstream() -> None:
    size = 64 * 1024 * 1024
    sent: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        block = b"x" * (1024 * 1024)
        for _ in range(size // len(block)):
            writer.write(block)
            await writer.drain()
            sent.append(len(block))

    async def body(pool: Upstream, base: str) -> None:
        response = await pool.request("GET", f"{base}/x", [], None)
        chunks = response.body()
        await chunks.__anext__()
        await asyncio.sleep(1.0)  # the browser reads nothing for a second
        # Bounded by the proxy's high-water mark plus the kernel's socket buffers, far below the whole body.
        assert sum(sent) < size // 2
        await response.aclose()

    _run(_serve(handler, body))


def test_the_switch_picks_the_client(proxy_client: bool) -> None:
    pool = upstream_pool(connect_timeout=2, io_timeout=1)
    assert isinstance(pool, UpstreamPool if proxy_client else HttpxUpstreamPool)
