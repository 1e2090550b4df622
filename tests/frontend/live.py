"""Helpers of the live-stream tests: opening streams as a browser (session cookie) or a client (API token).

Tests are synchronous functions that run one async scenario with
`async_to_sync`; the scenario reaches the database through
`database_sync_to_async`, as the consumers do.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from asgiref.testing import ApplicationCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from gpucloud.asgi import application
from tenants.context import Actor
from tenants.models import Tenant
from tenants.services.tokens import create_token

ORIGIN = (b"origin", b"http://localhost")
Headers = list[tuple[bytes, bytes]]


class WebsocketCommunicator(ApplicationCommunicator):
    """A WebSocket client for an ASGI app in this process, as Channels' own (whose module needs Daphne)."""

    def __init__(self, app: Any, path: str, *, headers: Headers, subprotocols: list[str] | None) -> None:
        parts = urlsplit(path)
        scope = {
            "type": "websocket",
            "path": unquote(parts.path),
            "raw_path": parts.path.encode(),
            "query_string": parts.query.encode(),
            "headers": headers,
            "subprotocols": subprotocols or [],
            "client": ("127.0.0.1", 50000),
            "server": ("localhost", 80),
        }
        super().__init__(app, scope)

    async def connect(self, timeout: float = 5) -> tuple[bool, Any]:
        """Return (True, accepted subprotocol) or (False, close code of a refused handshake)."""
        await self.send_input({"type": "websocket.connect"})
        response = await self.receive_output(timeout)
        if response["type"] == "websocket.close":
            return False, response.get("code", 1000)
        return True, response.get("subprotocol")

    async def receive_json_from(self, timeout: float = 5) -> Any:
        response = await self.receive_output(timeout)
        assert response["type"] == "websocket.send", response
        return json.loads(response["text"])

    async def disconnect(self, code: int = 1000, timeout: float = 5) -> None:
        await self.send_input({"type": "websocket.disconnect", "code": code})
        await self.wait(timeout)


@pytest.fixture
def fresh_live_layer(settings: Any) -> None:
    """Give the live layer a prefix of its own in Redis: pub/sub channels ignore the database number,
    so concurrent runs sharing one Redis would otherwise hear each other's groups."""
    if "CONFIG" in settings.CHANNEL_LAYERS["live"]:
        layers = dict(settings.CHANNEL_LAYERS)
        config = {**layers["live"]["CONFIG"], "prefix": f"test{uuid.uuid4().hex[:12]}"}
        settings.CHANNEL_LAYERS = {**layers, "live": {**layers["live"], "CONFIG": config}}


def session_headers(user: User, *, origin: tuple[bytes, bytes] | None = ORIGIN) -> Headers:
    """Return handshake headers carrying a fresh console session of `user` (and an allowed Origin)."""
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return [(b"cookie", cookie.encode()), *([origin] if origin else [])]


def token_for(user: User, tenant: Tenant | None, role: str) -> str:
    """Return the secret of a new API token of `user`."""
    return create_token(actor=Actor(user=user), tenant=tenant, name="live", role=role, expires_in_days=1).secret


def bearer_protocols(secret: str) -> list[str]:
    return ["gpucloud.v1", f"gpucloud.bearer.{secret}"]


async def open_stream(
    path: str, *, headers: Headers | None = None, subprotocols: list[str] | None = None
) -> tuple[WebsocketCommunicator, bool, Any]:
    """Open `path` on the console's ASGI application; return the communicator, whether it was accepted,
    and the accepted subprotocol (or the close code of a refused handshake)."""
    communicator = WebsocketCommunicator(application, path, headers=headers or [], subprotocols=subprotocols)
    connected, detail = await communicator.connect(timeout=10)
    return communicator, connected, detail


async def receive(communicator: WebsocketCommunicator, timeout: float = 5) -> dict[str, Any]:
    """Return the next JSON message; fails on a close or a timeout."""
    message: dict[str, Any] = await communicator.receive_json_from(timeout=timeout)
    return message


async def close_code(communicator: WebsocketCommunicator, timeout: float = 5) -> int | None:
    """Return the code the server closed with, skipping data messages sent before the close."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        output = await communicator.receive_output(timeout=max(deadline - loop.time(), 0.01))
        if output["type"] == "websocket.close":
            code: int | None = output.get("code")
            return code


async def nothing_more(communicator: WebsocketCommunicator, timeout: float = 0.5) -> bool:
    """Return whether no message arrives within `timeout` seconds."""
    return await communicator.receive_nothing(timeout=timeout)
