"""Downloads stream under ASGI: the response reads the file chunk by chunk, never whole."""

from __future__ import annotations

import asyncio
import io

from django.core.handlers.asgi import ASGIRequest
from django.test import RequestFactory

from common.downloads import file_download


def _asgi_request() -> ASGIRequest:
    scope = {"type": "http", "method": "GET", "path": "/x", "query_string": b"", "headers": []}
    return ASGIRequest(scope, io.BytesIO(b""))


class _Counting(io.BytesIO):
    """A file that remembers the largest read asked of it."""

    largest = 0

    def read(self, size: int | None = -1) -> bytes:
        self.largest = max(self.largest, size or 0)
        return super().read(size)


def test_under_asgi_the_file_is_read_in_chunks_by_an_async_iterator_and_closed() -> None:
    opened = _Counting(b"x" * 10_000)
    response = file_download(_asgi_request(), opened, filename="big.bin", chunk=1024)
    assert response.is_async, "a synchronous iterator would be read whole by Django's ASGI handler"
    assert response["Content-Length"] == "10000"
    assert response["Content-Disposition"] == 'attachment; filename="big.bin"'

    async def consume() -> list[bytes]:
        return [chunk async for chunk in response.streaming_content]  # type: ignore[union-attr]

    chunks = asyncio.run(consume())
    assert b"".join(chunks) == b"x" * 10_000
    assert max(len(chunk) for chunk in chunks) <= 1024 and opened.largest == 1024
    assert opened.closed


def test_under_wsgi_the_servers_file_wrapper_streams_it() -> None:
    response = file_download(RequestFactory().get("/x"), io.BytesIO(b"abc"), filename="a.txt")
    assert not response.is_async and response.file_to_stream is not None
