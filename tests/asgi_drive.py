"""Drive the console's real ASGI application with a request body the test controls, and read its answer.

`answer` runs one HTTP request through `gpucloud.asgi.application` with the
test's `receive` (which can count what the app read, trickle, or never end)
and returns once the response is whole; it fails the test past 20 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import async_to_sync

from gpucloud.asgi import application

Message = dict[str, Any]


def http_scope(method: str, path: str, headers: list[tuple[bytes, bytes]], query: bytes = b"") -> dict[str, Any]:
    """Return an ASGI HTTP scope for `method path?query` on host localhost from 127.0.0.1, with `headers` added."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"localhost"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("localhost", 80),
    }


def answer(scope: dict[str, Any], receive: Callable[[], Awaitable[Message]]) -> tuple[int, bytes]:
    """Send one request through the real ASGI app; return its status and whole body."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def run() -> None:
        task = asyncio.create_task(application(scope, receive, send))
        deadline = asyncio.get_running_loop().time() + 20
        # The app may keep waiting for a disconnect once it answered: stop when the answer is whole.
        while not any(m["type"] == "http.response.body" and not m.get("more_body") for m in sent):
            assert asyncio.get_running_loop().time() < deadline and not task.done(), f"no answer: {sent}"
            await asyncio.sleep(0.01)
        task.cancel()

    async_to_sync(run)()
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
