"""File downloads that stream under ASGI as they do under WSGI.

Django's ASGI handler reads a response with a synchronous iterator (a plain
`FileResponse`) whole into memory before it sends a byte: a 1 GiB download
would cost the web process 1 GiB. Under ASGI the file is therefore read
chunk by chunk in a worker thread by an asynchronous iterator; under WSGI
(the test client, `runserver`) the server's own file wrapper streams it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import BinaryIO

from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, HttpRequest

CHUNK = 1 << 20


async def _chunks(opened: BinaryIO, size: int) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(opened.read, size):
            yield chunk
    finally:
        opened.close()


def file_download(request: HttpRequest, opened: BinaryIO, *, filename: str, chunk: int = CHUNK) -> FileResponse:
    """Return `opened` as an attachment named `filename`, with its length, streamed in `chunk`-byte reads.

    The response owns `opened` and closes it when it is done or abandoned.
    """
    response = FileResponse(opened, as_attachment=True, filename=filename, content_type="application/octet-stream")
    response.block_size = chunk
    if isinstance(request, ASGIRequest):
        response.streaming_content = _chunks(opened, chunk)
    return response
