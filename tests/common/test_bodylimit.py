"""Request bodies are limited and timed in the ASGI layer (common/bodylimit.py), before anything buffers them.

Each test drives the console's real ASGI application (`gpucloud.asgi.application`)
with a generated body: the client "sends" chunks only when the app asks for
them, so a test sees exactly how much the app read. A client that would send
1 GB stops after MORE_THAN_ANY_LIMIT bytes and hangs up instead, so the code
as it was (which read every body whole) fails these tests quickly rather
than filling the disk.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from common import bodylimit
from common.asgitypes import Message
from tests.asgi_drive import answer, http_scope
from tests.conftest import World
from tests.frontend.live import session_headers, token_for

pytestmark = pytest.mark.django_db(transaction=True)

GIGABYTE = 1024**3
CHUNK = 1024**2
MORE_THAN_ANY_LIMIT = 24 * CHUNK


class Client:
    """One HTTP request to the ASGI app, with a body of `size` bytes sent in CHUNKs as the app reads them."""

    def __init__(self, size: int, *, stall_after: int | None = None) -> None:
        self.size, self.stall_after = size, stall_after
        self.sent = 0
        self.hung_up = False

    async def receive(self) -> Message:
        if self.hung_up or self.sent >= self.size:
            await asyncio.sleep(3600)  # the body is whole: the app waits here for a disconnect
        if self.stall_after is not None and self.sent >= self.stall_after:
            await asyncio.sleep(3600)  # a client that stops sending mid-body
        if self.sent >= MORE_THAN_ANY_LIMIT:
            self.hung_up = True  # the app went on reading past every limit: give up rather than send 1 GB
            return {"type": "http.disconnect"}
        chunk = min(CHUNK, self.size - self.sent)
        self.sent += chunk
        return {"type": "http.request", "body": b"\0" * chunk, "more_body": self.sent < self.size}


def request(
    method: str,
    path: str,
    client: Client,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    chunked: bool = False,
    query: bytes = b"",
) -> tuple[int, dict[str, Any]]:
    """Send the request through the real ASGI app; return its status and JSON body (a test fails past 20 s)."""
    # As an HTTP/1.1 server passes them on: a chunked body says so, a sized one gives its length.
    length = [(b"transfer-encoding", b"chunked")] if chunked else [(b"content-length", str(client.size).encode())]
    status, body = answer(http_scope(method, path, [*length, *(headers or [])], query), client.receive)
    return status, json.loads(body) if body.startswith(b"{") else {}


@pytest.fixture(autouse=True)
def no_principal_remembered() -> None:
    """Each test starts with no principal remembered from another (common.bodylimit._principals)."""
    bodylimit._principals.clear()


@pytest.fixture
def upload_dir(settings: Any, tmp_path: Path) -> Path:
    """Where Django spools request bodies and uploads past memory: must stay empty."""
    folder = tmp_path / "spool"
    folder.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(folder)
    return folder


@pytest.mark.parametrize(
    "path", ["/api/v1/me/", "/login/", "/api/v1/agent/join", "/api/v1/tenants/tenant-a/workloads/"]
)
def test_a_declared_gigabyte_from_anyone_is_refused_unread(world: World, upload_dir: Path, path: str) -> None:
    client = Client(GIGABYTE)
    status, body = request("POST", path, client)
    assert status == 413 and body["error"]["code"] == "too_large"
    assert client.sent == 0
    assert list(upload_dir.iterdir()) == []


@pytest.mark.parametrize("path", ["/api/v1/me/", "/login/", "/api/v1/tenants/tenant-a/workloads/"])
def test_a_chunked_gigabyte_from_anyone_stops_being_read_at_the_anonymous_limit(
    world: World, upload_dir: Path, settings: Any, path: str
) -> None:
    client = Client(GIGABYTE)
    status, _ = request("POST", path, client, chunked=True)
    assert status == 413
    assert client.sent <= settings.BODY_LIMIT_ANONYMOUS + CHUNK
    assert list(upload_dir.iterdir()) == []


def test_a_signed_in_user_may_send_more_than_anonymous_but_not_past_the_default(world: World, settings: Any) -> None:
    headers = session_headers(world.member_a)
    # Past the anonymous limit, within the default: the request reaches the view (which refuses it as JSON).
    status, body = request("POST", "/api/v1/me/", Client(settings.BODY_LIMIT_ANONYMOUS * 2), headers=headers)
    assert status != 413, body
    client = Client(GIGABYTE)
    status, _ = request("POST", "/api/v1/me/", client, headers=headers, chunked=True)
    assert status == 413 and client.sent <= settings.BODY_LIMIT_DEFAULT + CHUNK


def test_a_forged_session_or_token_counts_as_anonymous(world: World, settings: Any) -> None:
    for headers in ([(b"cookie", b"sessionid=forged")], [(b"authorization", b"Bearer gpc_forged")]):
        client = Client(settings.BODY_LIMIT_ANONYMOUS * 2)
        assert request("POST", "/api/v1/me/", client, headers=headers)[0] == 413
        assert client.sent == 0


def test_an_upload_route_takes_its_own_larger_limit(world: World, settings: Any) -> None:
    settings.BODY_LIMIT_UPLOAD = 4 * CHUNK
    secret = token_for(world.member_a, world.tenant_a, "member")
    headers = [(b"authorization", f"Bearer {secret}".encode())]
    path = "/api/v1/tenants/tenant-a/volumes/nowhere/files/content/"
    # Beyond the default limit of every other route, within the upload route's: the view answers (404: no volume).
    settings.BODY_LIMIT_DEFAULT = 2 * CHUNK
    status, _ = request("PUT", path, Client(3 * CHUNK), headers=headers)
    assert status == 404
    client = Client(5 * CHUNK)
    assert request("PUT", path, client, headers=headers)[0] == 413
    assert client.sent == 0


def test_a_body_that_stops_arriving_times_out(world: World, settings: Any) -> None:
    settings.BODY_IDLE_SECONDS = 1
    client = Client(32 * 1024, stall_after=0)
    status, body = request("POST", "/login/", client)
    assert status == 408 and body["error"]["code"] == "timeout"


def test_a_body_trickling_below_the_minimum_rate_times_out(world: World, settings: Any) -> None:
    settings.BODY_IDLE_SECONDS = 30
    settings.BODY_READ_GRACE_SECONDS = 1
    settings.BODY_MIN_BYTES_PER_SECOND = 100
    # Two bytes a second would keep the idle timer happy forever: the average rate catches it.
    client = Client(32 * 1024)

    async def trickle() -> Message:
        await asyncio.sleep(0.5)
        client.sent += 1
        return {"type": "http.request", "body": b"x", "more_body": True}

    client.receive = trickle  # type: ignore[method-assign]  # a client slower than the rule allows
    status, _ = request("POST", "/login/", client)
    assert status == 408


# --- volume uploads: streamed to the volume, the room checked before and while bytes arrive --------------


def _home_upload(world: World, settings: Any, limit: int) -> tuple[str, list[tuple[bytes, bytes]], Path]:
    """Return (upload path, headers) for member_a's home volume limited to `limit` bytes, and its directory."""
    from inventory.services import volumes
    from inventory.services.volume_access import host_path
    from tenants.context import Actor
    from tests.jobs.factories import assign

    assign(world.member_a, world.project_a)
    home = volumes.home_volume(tenant=world.tenant_a, user=world.member_a)
    volumes.update_volume(actor=Actor(user=world.admin_a), volume=home, size_limit_bytes=limit)
    secret = token_for(world.member_a, world.tenant_a, "member")
    path = f"/api/v1/tenants/tenant-a/volumes/{home.pk}/files/content/"
    return path, [(b"authorization", f"Bearer {secret}".encode())], Path(host_path(home.backend, home, console=True))


def test_an_upload_over_the_volumes_room_is_refused_before_a_byte_is_read(
    world: World, settings: Any, upload_dir: Path
) -> None:
    path, headers, directory = _home_upload(world, settings, CHUNK)
    client = Client(64 * CHUNK)
    status, body = request("PUT", path, client, headers=headers, query=b"path=big.bin")
    assert status == 413 and set(body["error"]["fields"]) == {"file"}
    assert client.sent == 0  # Django no longer spools the body before the view checks the room
    assert list(upload_dir.iterdir()) == []
    assert not directory.exists() or list(directory.rglob("*")) == []


def test_an_upload_within_the_room_streams_into_the_volume(world: World, settings: Any, upload_dir: Path) -> None:
    path, headers, directory = _home_upload(world, settings, 8 * CHUNK)
    client = Client(3 * CHUNK)
    status, body = request("PUT", path, client, headers=headers, query=b"path=ok.bin")
    assert status == 200 and body["size"] == 3 * CHUNK
    assert (directory / "ok.bin").stat().st_size == 3 * CHUNK
    assert list(upload_dir.iterdir()) == []


def test_an_upload_that_stalls_midway_times_out_and_leaves_no_partial_file(
    world: World, settings: Any, upload_dir: Path
) -> None:
    settings.BODY_IDLE_SECONDS = 1
    path, headers, directory = _home_upload(world, settings, 8 * CHUNK)
    client = Client(4 * CHUNK, stall_after=2 * CHUNK)
    status, body = request("PUT", path, client, headers=headers, query=b"path=half.bin")
    assert status == 408 and body["error"]["code"] == "timeout"
    assert list(directory.rglob("*")) == [] and list(upload_dir.iterdir()) == []


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every principal lookup the body limit makes, by Authorization header (the real check still answers)."""
    from gpucloud.credentials import has_valid_credentials

    seen: list[str] = []

    def counted(authorization: str, session_key: str | None) -> bool:
        seen.append(authorization)
        return has_valid_credentials(authorization, session_key)

    monkeypatch.setattr(bodylimit, "import_string", lambda _path: counted)
    return seen


def test_a_request_with_no_body_costs_no_lookup(world: World, settings: Any, lookups: list[str]) -> None:
    secret = token_for(world.member_a, world.tenant_a, "member")
    headers = [(b"authorization", f"Bearer {secret}".encode())]
    asked: list[Message] = []

    async def no_body() -> Message:
        if asked:
            await asyncio.sleep(3600)
        asked.append({"type": "http.request", "body": b"", "more_body": False})
        return asked[0]

    status, _ = answer(http_scope("GET", "/api/v1/tenants/tenant-a/", headers), no_body)
    assert status == 200 and lookups == []
    # A body that comes anyway without Content-Length or Transfer-Encoding is held to the anonymous limit.
    client = Client(GIGABYTE)
    status, _ = answer(http_scope("POST", "/api/v1/me/", headers), client.receive)
    assert status == 413 and client.sent <= settings.BODY_LIMIT_ANONYMOUS + CHUNK and lookups == []


def test_a_recognised_principal_is_remembered_briefly_and_a_stranger_never(
    world: World, settings: Any, lookups: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = token_for(world.member_a, world.tenant_a, "member")
    mine = [(b"authorization", f"Bearer {secret}".encode())]
    forged = [(b"authorization", b"Bearer gpc_forged")]
    big = settings.BODY_LIMIT_ANONYMOUS * 2
    for _ in range(3):
        assert request("POST", "/api/v1/me/", Client(big), headers=mine)[0] != 413
        assert request("POST", "/api/v1/me/", Client(big), headers=forged)[0] == 413
    assert lookups == [f"Bearer {secret}", "Bearer gpc_forged", "Bearer gpc_forged", "Bearer gpc_forged"]
    monkeypatch.setattr(bodylimit, "PRINCIPAL_MEMORY_SECONDS", 0.0)
    bodylimit._principals.clear()
    for _ in range(2):
        assert request("POST", "/api/v1/me/", Client(big), headers=mine)[0] != 413
    assert lookups[4:] == [f"Bearer {secret}"] * 2, "past its time a principal is looked up again"
