"""The file browser's upload form in Chromium against the console's ASGI application under uvicorn.

Under ASGI the volume page's posts are streamed (common/streaming.py) and the
upload is held to the room as it is parsed (frontend/uploads.py): a file
that fits lands in the folder the page shows; one past the room is refused
on the form, naming its file field, and nothing is written. The page's
url-encoded posts (a new folder) are read from the same stream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inventory.models import Volume
from inventory.services import volume_files, volumes
from inventory.services.volume_access import host_path
from tenants.context import Actor
from tenants.scoping import tenant_scope
from tests.browser.test_console import log_in
from tests.conftest import World
from tests.jobs.factories import assign

pytestmark = pytest.mark.browser

KIB = 1024


@pytest.fixture
def small(live_world: World) -> Volume:
    """member_a's project volume in alpha, limited to 256 KiB, with an empty folder `data`."""
    world = live_world
    assign(world.member_a, world.project_a)
    volume = volumes.create_volume(
        actor=Actor(user=world.admin_a),
        tenant=world.tenant_a,
        kind="project",
        name="small",
        project=world.project_a,
        size_limit_bytes=256 * KIB,
    )
    with tenant_scope(world.tenant_a):  # the service reads the volume's shares, which are tenant-scoped
        volume_files.make_folder(actor=Actor(user=world.member_a), volume=volume, path="data")
    return volume


def _upload(page: Any, volume: Volume, name: str, size: int) -> None:
    page.goto(f"/t/tenant-a/storage/{volume.pk}/?path=data")
    page.set_input_files(
        "input[name=up-file]", files=[{"name": name, "mimeType": "application/octet-stream", "buffer": b"x" * size}]
    )
    page.click("#upload button[type=submit]")


def test_a_file_that_fits_lands_in_the_folder_shown_and_one_past_the_room_is_refused(
    small: Volume, live_page: Any
) -> None:
    root = Path(host_path(small.backend, small, console=True))
    log_in(live_page, "member_a")
    live_page.wait_for_url("**/t/tenant-a/")

    _upload(live_page, small, "fits.bin", 100 * KIB)
    live_page.wait_for_selector("#messages >> text=Uploaded.")
    assert live_page.locator("text=fits.bin").count() >= 1
    assert (root / "data" / "fits.bin").stat().st_size == 100 * KIB

    _upload(live_page, small, "big.bin", 512 * KIB)
    error = live_page.locator('[data-field="file"]')
    error.wait_for()
    assert "size limit" in error.inner_text() and "Nothing was written" in error.inner_text()
    assert sorted(p.name for p in (root / "data").iterdir()) == ["fits.bin"]

    # The page's other posts (url-encoded) are read from the same stream.
    live_page.fill("#new-folder input[name=dir-path]", "more")
    live_page.click("#new-folder button[type=submit]")
    live_page.wait_for_selector("#messages >> text=Folder made.")
    assert (root / "data" / "more").is_dir()
