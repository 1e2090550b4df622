"""Django's ASGI handler, with the bodies of streamed routes read as the view reads them, never spooled first.

Django's handler reads a request's whole body into a temporary file (on disk
past FILE_UPLOAD_MAX_MEMORY_SIZE) before the view runs: a 64 MiB upload into
a volume with 1 MiB left was written to the web host's disk whole before the
view refused it. For the routes `common.bodylimit.ROUTES` marks `streamed`
(the API's raw volume upload, the file browser's posts), the request's body
here is a stream over the ASGI `receive`: the view checks the room first
(Content-Length), then `volume_files.upload_file` writes the bytes as they
arrive, counting them against the quota, so a refused upload reads and
writes nothing more. The file browser's multipart form is parsed from the
stream as it arrives, held to the room by `frontend.uploads.RoomLimit`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import IO, Any

import django
from asgiref.sync import async_to_sync
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler

from common.asgitypes import Scope

# Django's own (django-stubs') types of the ASGI callables, which its handler's methods are declared with.
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]

_streaming: ContextVar[ReceiveStream | None] = ContextVar("streamed_body", default=None)


class ReceiveStream:
    """A request body read from ASGI `receive` as it is asked for (`read`, from the view's thread).

    `finished` is set once the body is whole (or the client went away): only then may anything else wait on
    `receive` for the disconnect. Raises RequestAborted from `read` when the client went away mid-body.
    """

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._buffer = bytearray()
        self._more = True
        self.finished = asyncio.Event()

    async def _next(self) -> None:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self._more = False
            self.finished.set()
            raise RequestAborted()
        self._buffer += message.get("body", b"")
        if not message.get("more_body", False):
            self._more = False
            self.finished.set()

    def read(self, size: int = -1) -> bytes:
        """Return up to `size` bytes (all that is left for -1); b"" once the body is over."""
        while self._more and (size < 0 or len(self._buffer) < size):
            async_to_sync(self._next)()
        cut = len(self._buffer) if size < 0 else min(size, len(self._buffer))
        data = bytes(self._buffer[:cut])
        del self._buffer[:cut]
        return data

    def readline(self, size: int = -1) -> bytes:
        """Return the next line, its b"\\n" included (at most `size` bytes); b"" once the body is over.

        Django's multipart parser drains what is left of a body line by line (`exhaust`).
        """
        while self._more and b"\n" not in self._buffer and (size < 0 or len(self._buffer) < size):
            async_to_sync(self._next)()
        end = self._buffer.find(b"\n") + 1 or len(self._buffer)
        return self.read(end if size < 0 else min(end, size))

    def close(self) -> None:
        self._buffer.clear()


class StreamingASGIHandler(ASGIHandler):
    """Django's ASGIHandler; streamed routes get a ReceiveStream as their body instead of a spooled file."""

    def __init__(self) -> None:
        super().__init__()
        # Imported once Django is set up: the route table's module imports DRF, which needs the app registry.
        from common.bodylimit import streamed_route

        self.streamed = streamed_route

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = ReceiveStream(receive) if self.streamed(scope.get("method", ""), scope.get("path", "")) else None
        token = _streaming.set(stream)
        try:
            await super().handle(scope, receive, send)
        finally:
            _streaming.reset(token)

    async def read_body(self, receive: Receive) -> ReceiveStream | IO[bytes]:  # type: ignore[override]  # or a stream
        stream = _streaming.get()
        return stream if stream is not None else await super().read_body(receive)

    async def listen_for_disconnect(self, receive: Receive) -> None:
        stream = _streaming.get()
        if stream is not None:
            # Until the view has read the body, `receive` is the view's; a view that never reads it ends first.
            await stream.finished.wait()
        await super().listen_for_disconnect(receive)


def get_streaming_asgi_application() -> StreamingASGIHandler:
    """Set Django up and return the streaming handler (as django.core.asgi.get_asgi_application does)."""
    django.setup(set_prefix=False)
    return StreamingASGIHandler()
