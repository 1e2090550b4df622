"""The file browser's upload form is held to the volume's room as its bytes arrive (frontend/uploads.py).

The ASGI tests drive the console's real application with a multipart body
the client sends only as the app asks for it, so a test sees how much of it
was read: an upload far past the room is refused after a few chunks, not
after Django spooled it whole to FILE_UPLOAD_TEMP_DIR, and leaves nothing
there nor in the volume.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from common.asgitypes import Message
from frontend.uploads import FORM_OVERHEAD
from inventory.models import Volume
from inventory.services import volume_files, volumes
from inventory.services.volume_access import host_path
from tenants.context import Actor
from tests.asgi_drive import answer, http_scope
from tests.conftest import World
from tests.frontend.live import session_headers
from tests.jobs.factories import assign

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 1024**2
SENT_CHUNK = 64 * 1024
BOUNDARY = "----gpucloudtestboundary"


class MultipartClient:
    """The upload form posted with a file of `size` bytes, sent in SENT_CHUNKs only as the app reads them."""

    def __init__(self, csrf: str, name: str, size: int, folder: str = "") -> None:
        fields = [("csrfmiddlewaretoken", csrf), ("action", "upload"), ("folder", folder)]
        head = "".join(f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields)
        head += (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="up-file"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        )
        self.head, self.tail = head.encode(), f"\r\n--{BOUNDARY}--\r\n".encode()
        self.file_size = size
        self.size = len(self.head) + size + len(self.tail)
        self.sent = 0

    def _bytes(self, start: int, end: int) -> bytes:
        whole_head, file_end = len(self.head), len(self.head) + self.file_size
        out = bytearray()
        out += self.head[start:end]
        out += b"x" * max(0, min(end, file_end) - max(start, whole_head))
        out += self.tail[max(0, start - file_end) : max(0, end - file_end)]
        return bytes(out)

    async def receive(self) -> Message:
        if self.sent >= self.size:
            await asyncio.sleep(3600)  # the body is whole: the app waits here for a disconnect
        end = min(self.sent + SENT_CHUNK, self.size)
        body, self.sent = self._bytes(self.sent, end), end
        return {"type": "http.request", "body": body, "more_body": self.sent < self.size}


def _post(path: str, client: MultipartClient, headers: list[tuple[bytes, bytes]]) -> tuple[int, str]:
    """Post through the real ASGI app; return the status and the page (a test fails past 20 s)."""
    multipart = [
        (b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode()),
        (b"content-length", str(client.size).encode()),
    ]
    status, body = answer(http_scope("POST", path, [*multipart, *headers]), client.receive)
    return status, body.decode()


@pytest.fixture
def upload_dir(settings: Any, tmp_path: Path) -> Path:
    """Where Django spools uploads past memory: must be empty once a request is answered."""
    folder = tmp_path / "spool"
    folder.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(folder)
    return folder


@pytest.fixture
def small(world: World) -> Volume:
    """member_a's project volume in alpha, limited to 1 MiB and empty."""
    assign(world.member_a, world.project_a)
    return volumes.create_volume(
        actor=Actor(user=world.admin_a),
        tenant=world.tenant_a,
        kind="project",
        name="small",
        project=world.project_a,
        size_limit_bytes=MIB,
    )


def _files(volume: Volume) -> list[Path]:
    root = Path(host_path(volume.backend, volume, console=True))
    return list(root.rglob("*")) if root.exists() else []


def _session(world: World) -> tuple[list[tuple[bytes, bytes]], str]:
    """Return headers with member_a's session and a CSRF cookie, and the form token that goes with it."""
    csrf = secrets.token_hex(16)  # a 32-character secret is its own valid form token
    cookie_header = dict(session_headers(world.member_a, origin=None))[b"cookie"]
    return [(b"cookie", cookie_header + f"; csrftoken={csrf}".encode())], csrf


def test_an_upload_declared_past_the_room_is_refused_after_a_few_chunks(
    world: World, small: Volume, upload_dir: Path
) -> None:
    headers, csrf = _session(world)
    client = MultipartClient(csrf, "big.bin", 8 * MIB)
    status, html = _post(f"/t/tenant-a/storage/{small.pk}/", client, headers)
    assert status == 200 and 'data-field="file"' in html and "volume&#x27;s size limit" in html, html[-2000:]
    assert client.sent <= 2 * SENT_CHUNK  # the code as it was spooled all 8 MiB before the view ran
    assert list(upload_dir.iterdir()) == []
    assert _files(small) == []


def test_an_upload_growing_past_the_room_midway_stops_there(world: World, small: Volume, upload_dir: Path) -> None:
    headers, csrf = _session(world)
    client = MultipartClient(csrf, "over.bin", MIB + FORM_OVERHEAD // 2)  # its declared length might still fit
    status, html = _post(f"/t/tenant-a/storage/{small.pk}/", client, headers)
    assert status == 200 and 'data-field="file"' in html and "Nothing was written" in html
    assert MIB < client.sent <= MIB + 2 * SENT_CHUNK
    assert list(upload_dir.iterdir()) == []
    assert _files(small) == []


def test_an_upload_within_the_room_lands_in_the_volume(world: World, small: Volume, upload_dir: Path) -> None:
    headers, csrf = _session(world)
    client = MultipartClient(csrf, "ok.bin", MIB)  # exactly the room
    status, _ = _post(f"/t/tenant-a/storage/{small.pk}/", client, headers)
    assert status == 302
    assert [(p.name, p.stat().st_size) for p in _files(small)] == [("ok.bin", MIB)]
    assert list(upload_dir.iterdir()) == []


def test_a_full_volume_still_takes_a_file_replacing_one_of_the_same_size(world: World, small: Volume) -> None:
    client = Client()
    client.force_login(world.member_a)
    upload = {"action": "upload", "folder": "", "up-file": _file("same.bin", MIB)}
    assert client.post(f"/t/tenant-a/storage/{small.pk}/", upload).status_code == 302
    small.refresh_from_db()
    assert volume_files.room_for(small) == 0
    again = {"action": "upload", "folder": "", "up-file": _file("same.bin", MIB)}
    assert client.post(f"/t/tenant-a/storage/{small.pk}/", again).status_code == 302


def test_the_upload_form_still_needs_its_csrf_token(world: World, small: Volume) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.member_a)
    page = client.get(f"/t/tenant-a/storage/{small.pk}/").content.decode()
    token = page.split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
    upload = {"action": "upload", "folder": "", "up-file": _file("a.txt", 10)}
    assert client.post(f"/t/tenant-a/storage/{small.pk}/", upload).status_code == 403
    assert _files(small) == []
    upload = {**upload, "up-file": _file("a.txt", 10), "csrfmiddlewaretoken": token}
    assert client.post(f"/t/tenant-a/storage/{small.pk}/", upload).status_code == 302
    assert [p.name for p in _files(small)] == ["a.txt"]


def _file(name: str, size: int) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, b"x" * size)
