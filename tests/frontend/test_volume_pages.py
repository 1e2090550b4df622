"""The Storage page and the file browser: what each persona sees and may do, and that errors write nothing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from frontend.views import volumes as pages
from inventory.drivers import storage
from inventory.models import Volume, VolumeShare
from inventory.selectors import StorageUse, storage_use
from inventory.services import volume_files, volumes
from inventory.services.volume_access import host_path
from tenants.context import Actor
from tenants.models import Project, Tenant
from tests.conftest import World
from tests.jobs.factories import assign

S = "/t/tenant-a/storage/"


def _streamed(response: Any) -> bytes:
    """Return the whole body of a streamed response."""
    return b"".join(response.streaming_content)


def _found(pattern: str, text: str) -> str:
    """Return the first match of `pattern` in `text` (across lines); fail the test when there is none."""
    match = re.search(pattern, text, re.S)
    assert match is not None, pattern
    return match.group(0)


def _session(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def alpha(world: World) -> Volume:
    """Alpha's project volume `alpha-files` (member_a and viewer_a work in alpha), holding hello.txt."""
    assign(world.member_a, world.project_a)
    assign(world.viewer_a, world.project_a)
    volume = volumes.create_volume(
        actor=Actor(user=world.admin_a),
        tenant=world.tenant_a,
        kind="project",
        name="alpha-files",
        project=world.project_a,
    )
    Path(volume_files.ensure_directory(volume), "hello.txt").write_bytes(b"hello")
    return volume


def _dir(volume: Volume) -> Path:
    return Path(host_path(volume.backend, volume, console=True))


def _files(volume: Volume) -> set[str]:
    root = _dir(volume)
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def _html(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def _url(volume: Volume, query: str = "") -> str:
    return f"{S}{volume.pk}/{query}"


# --- the Storage page ---------------------------------------------------------------


def test_the_storage_page_lists_what_each_persona_may_see_with_mount_paths_and_use(world: World, alpha) -> None:
    gamma = Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    volumes.create_volume(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, kind="dataset", name="private", project=gamma
    )
    volumes.home_volume(tenant=world.tenant_a, user=world.admin_a)
    Volume.all_tenants.filter(pk=alpha.pk).update(used_bytes=3 * 1024**2, size_limit_bytes=4 * 1024**2)
    member = _html(_session(world.member_a).get(S))
    assert 'data-volume="alpha-files"' in member and "<code>/projects/alpha-files</code>" in member
    assert "3.0\xa0MB / 4.0\xa0MB" in member and '<progress value="75" max="100">' in member
    assert 'data-volume="private"' not in member and "home-" not in member, "another project's and another's home"
    assert 'id="create-volume"' not in member and 'id="open-home"' in member
    admin = _html(_session(world.admin_a).get(S))
    assert 'data-volume="private"' in admin and "<code>/datasets/private</code>" in admin
    assert "<code>/home/admin_a</code>" in admin and 'id="create-volume"' in admin
    assert 'id="set-project-storage"' in admin and 'id="set-tenant-storage"' not in admin
    viewer = _html(_session(world.viewer_a).get(S))
    assert 'data-volume="alpha-files"' in viewer and 'id="open-home"' not in viewer
    assert 'id="set-tenant-storage"' in _html(_session(world.operator).get(S))


def test_the_storage_page_shows_the_tenants_and_projects_quotas_with_their_use(world: World, alpha) -> None:
    Tenant.objects.filter(pk=world.tenant_a.pk).update(storage_limit_bytes=10 * 1024**3, home_limit_bytes=1024**3)
    Project.all_tenants.filter(pk=world.project_a.pk).update(storage_limit_bytes=2 * 1024**3)
    Volume.all_tenants.filter(pk=alpha.pk).update(used_bytes=1024**3)
    html = _html(_session(world.viewer_a).get(S))
    tenant_row = _found(r'<tr data-quota="tenant">.*?</tr>', html)
    assert "1.0\xa0GB / 10.0\xa0GB" in tenant_row and "each home: at most 1.0\xa0GB" in tenant_row
    alpha_row = _found(r'<tr data-quota="alpha">.*?</tr>', html)
    assert "1.0\xa0GB / 2.0\xa0GB" in alpha_row and '<progress value="50"' in alpha_row


def test_the_page_and_the_upload_quotas_read_one_storage_use(world: World, alpha) -> None:
    """`storage_use` counts every volume of the tenant (one without a project too) and no other tenant's; the
    storage page and the upload quotas (`volume_files.room`) both show what it says."""
    admin = Actor(user=world.admin_a)
    make = volumes.create_volume
    gamma = Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    used = {
        alpha: 300,
        make(actor=admin, tenant=world.tenant_a, kind="project", name="gamma-files", project=gamma): 50,
        make(actor=admin, tenant=world.tenant_a, kind="dataset", name="shared-data"): 7,
        make(actor=Actor(user=world.admin_b), tenant=world.tenant_b, kind="project", name="b-files",
             project=world.project_b): 10_000,
    }  # fmt: skip
    for volume, size in used.items():
        Volume.all_tenants.filter(pk=volume.pk).update(used_bytes=size)
    use = storage_use(world.tenant_a.pk)
    assert use == StorageUse(total=357, by_project={world.project_a.pk: 300, gamma.pk: 50})
    assert (use.of_project(gamma.pk), storage_use(world.tenant_b.pk).total) == (50, 10_000)
    Tenant.objects.filter(pk=world.tenant_a.pk).update(storage_limit_bytes=1000)
    Project.all_tenants.filter(pk=world.project_a.pk).update(storage_limit_bytes=400)
    alpha.refresh_from_db()
    assert volume_files.room(alpha).left == 100  # the project's 400 less its 300: tighter than 1000 - 357
    Project.all_tenants.filter(pk=world.project_a.pk).update(storage_limit_bytes=None)
    alpha.refresh_from_db()
    assert volume_files.room(alpha).left == 1000 - 357
    html = _html(_session(world.admin_a).get(S))
    assert "357\xa0bytes / 1000\xa0bytes" in _found(r'<tr data-quota="tenant">.*?</tr>', html)
    assert "50\xa0bytes" in _found(r'<tr data-quota="gamma">.*?</tr>', html)


def test_an_admin_creates_a_volume_with_a_limit_in_gib(world: World) -> None:
    response = _session(world.admin_a).post(
        S,
        {"action": "create", "new-kind": "project", "new-name": "scratch", "new-project": "alpha",
         "new-size_limit_bytes": "1.5"},
    )  # fmt: skip
    assert response.status_code == 302
    made = Volume.all_tenants.get(name="scratch")
    assert (made.kind, made.project_id, made.size_limit_bytes) == ("project", world.project_a.pk, 3 * 1024**3 // 2)


def test_bad_volume_input_is_shown_on_the_form_and_creates_nothing(world: World) -> None:
    client = _session(world.admin_a)
    html = _html(client.post(S, {"action": "create", "new-kind": "project", "new-name": "Bad Name!"}))
    assert 'data-field="name"' in html and 'data-field="project"' in html
    negative = _html(
        client.post(S, {"action": "create", "new-kind": "dataset", "new-name": "d", "new-size_limit_bytes": "-1"})
    )
    assert 'data-field="size_limit_bytes"' in negative
    assert not Volume.all_tenants.exists()


def test_members_may_not_create_volumes_through_the_page(world: World, alpha) -> None:
    response = _session(world.member_a).post(S, {"action": "create", "new-kind": "dataset", "new-name": "mine"})
    assert response.status_code == 403
    assert not Volume.all_tenants.filter(name="mine").exists()


def test_storage_quotas_are_set_by_whom_they_belong_to_and_refused_when_negative(world: World) -> None:
    operator = _session(world.operator)
    assert (
        operator.post(
            S, {"action": "tenant_quota", "tq-storage_limit_bytes": "100", "tq-home_limit_bytes": "10"}
        ).status_code
        == 302
    )
    tenant = Tenant.objects.get(pk=world.tenant_a.pk)
    assert (tenant.storage_limit_bytes, tenant.home_limit_bytes) == (100 * 1024**3, 10 * 1024**3)
    refused = _html(
        operator.post(S, {"action": "tenant_quota", "tq-storage_limit_bytes": "-1", "tq-home_limit_bytes": ""})
    )
    assert 'data-field="storage_limit_bytes"' in refused
    assert Tenant.objects.get(pk=world.tenant_a.pk).storage_limit_bytes == 100 * 1024**3
    admin = _session(world.admin_a)
    assert admin.post(S, {"action": "tenant_quota", "tq-storage_limit_bytes": "1"}).status_code == 403
    above = _html(admin.post(S, {"action": "project_quota", "pq-project": "alpha", "pq-storage_limit_bytes": "101"}))
    assert 'data-field="storage_limit_bytes"' in above and "exceeds the tenant" in above
    assert (
        admin.post(S, {"action": "project_quota", "pq-project": "alpha", "pq-storage_limit_bytes": "50"}).status_code
        == 302
    )
    assert Project.all_tenants.get(pk=world.project_a.pk).storage_limit_bytes == 50 * 1024**3


def test_open_my_home_makes_it_on_first_use_and_viewers_have_none(world: World) -> None:
    response = _session(world.member_a).post(S, {"action": "home"})
    home = Volume.all_tenants.get(kind="home", owner=world.member_a)
    assert response.status_code == 302 and response["Location"] == f"{S}{home.pk}/"
    assert "<code>/home/member_a</code>" in _html(_session(world.member_a).get(response["Location"]))
    assert _session(world.viewer_a).post(S, {"action": "home"}).status_code == 403
    assert Volume.all_tenants.filter(kind="home").count() == 1


# --- the file browser --------------------------------------------------------------


def test_the_browser_shows_breadcrumbs_folders_and_download_links(world: World, alpha) -> None:
    root = _dir(alpha)
    (root / "runs" / "exp 1").mkdir(parents=True)
    (root / "runs" / "exp 1" / "log&.txt").write_bytes(b"log")
    html = _html(_session(world.viewer_a).get(_url(alpha, "?path=runs/exp%201")))
    crumbs = _found(r'<nav aria-label="breadcrumb".*?</nav>', html)
    assert "/projects/alpha-files" in crumbs and '<a href="?path=runs">runs</a>' in crumbs and "exp 1" in crumbs
    link = f"/t/tenant-a/storage/{alpha.pk}/download/?path=runs/exp%201/log%26.txt"
    assert f'href="{link}"' in html
    download = _session(world.viewer_a).get(link)
    assert download.status_code == 200 and _streamed(download) == b"log"
    assert download["Content-Disposition"] == 'attachment; filename="log&.txt"'
    top = _html(_session(world.viewer_a).get(_url(alpha)))
    assert '<a href="?path=runs" class="folder">runs/</a>' in top
    assert 'id="upload"' not in top and "Delete" not in top, "a viewer sees no writes"


def test_a_folder_of_many_files_is_paged_200_at_a_time(world: World, alpha) -> None:
    root = _dir(alpha)
    (root / "many").mkdir()
    names = sorted(f"f{i:04d}" for i in range(450))
    for name in names:
        (root / "many" / name).touch()
    client = _session(world.member_a)
    seen = []
    for number in (1, 2, 3):
        html = _html(client.get(_url(alpha, f"?path=many&page={number}")))
        seen += re.findall(r'<tr data-entry="([^"]+)"', html)
        assert ("Next →" in html) == (number < 3)
        assert ("← Previous" in html) == (number > 1)
    assert seen == names


def test_an_upload_streams_into_the_volume_in_chunks(world: World, alpha, monkeypatch) -> None:
    sizes: list[int] = []
    real = storage.write_file

    def write_file(volume_dir: str, rel: str, chunks: Any, max_bytes: int) -> int:
        def counted() -> Any:
            for chunk in chunks:
                sizes.append(len(chunk))
                yield chunk

        return real(volume_dir, rel, counted(), max_bytes)

    monkeypatch.setattr(storage, "write_file", write_file)
    payload = b"0123456789abcdef" * (200 * 1024)  # 3.2 MB: past Django's in-memory limit, spooled to a temporary file
    response = _session(world.member_a).post(
        _url(alpha), {"action": "upload", "folder": "", "up-file": SimpleUploadedFile("data.bin", payload)}
    )
    assert response.status_code == 302, response.content
    assert (_dir(alpha) / "data.bin").read_bytes() == payload
    assert len(sizes) >= 4 and max(sizes) <= pages.CHUNK
    assert Volume.all_tenants.get(pk=alpha.pk).used_bytes == len(payload)


def test_an_upload_over_the_quota_is_shown_and_writes_nothing(world: World, alpha) -> None:
    Tenant.objects.filter(pk=world.tenant_a.pk).update(storage_limit_bytes=100)
    html = _html(
        _session(world.member_a).post(
            _url(alpha), {"action": "upload", "folder": "", "up-file": SimpleUploadedFile("big.bin", b"x" * 101)}
        )
    )
    assert 'data-field="file"' in html and "tenant&#x27;s storage quota" in html and "Nothing was written" in html
    assert _files(alpha) == {"hello.txt"}


def test_folders_are_made_in_the_current_folder_and_deleted_with_confirmation(world: World, alpha) -> None:
    client = _session(world.member_a)
    (_dir(alpha) / "top").mkdir()
    made = client.post(_url(alpha), {"action": "folder", "folder": "top", "dir-path": "inner"})
    assert made.status_code == 302 and made["Location"] == f"{S}{alpha.pk}/?path=top"
    assert (_dir(alpha) / "top" / "inner").is_dir()
    html = _html(client.get(_url(alpha)))
    assert 'data-confirm="Delete top and everything in it? This cannot be undone."' in html
    gone = client.post(_url(alpha), {"action": "delete", "folder": "", "path": "top"})
    assert gone.status_code == 302
    assert _files(alpha) == {"hello.txt"}
    again = _html(client.post(_url(alpha), {"action": "delete", "folder": "", "path": "top"}))
    assert 'id="file-errors"' in again and "does not exist" in again


@pytest.fixture
def planted(alpha, tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"secret")
    (_dir(alpha) / "out").symlink_to(outside)
    (_dir(alpha) / "passwd").symlink_to(outside / "secret.txt")
    return outside


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "out", "out/secret.txt", "passwd"])
def test_paths_that_lead_out_are_refused_on_the_page_and_touch_nothing(world: World, alpha, planted, path: str) -> None:
    client = _session(world.member_a)
    listing = _html(client.get(_url(alpha), {"path": path}))
    assert 'id="listing-error"' in listing and "secret" not in listing.replace("secret.txt", "")
    download = client.get(f"{S}{alpha.pk}/download/", {"path": path})
    assert download.status_code == 400 and b"secret\n" not in download.content and download.content != b"secret"
    folder = _html(client.post(_url(alpha), {"action": "folder", "folder": path, "dir-path": "x"}))
    assert 'data-field="path"' in folder
    if path not in ("out", "passwd"):  # deleting a link itself is allowed (the API's tests hold it to that)
        deleted = _html(client.post(_url(alpha), {"action": "delete", "folder": "", "path": path}))
        assert 'id="file-errors"' in deleted
    assert sorted(p.name for p in planted.iterdir()) == ["secret.txt"]
    assert (planted / "secret.txt").read_bytes() == b"secret"
    assert _files(alpha) == {"hello.txt", "out", "passwd"}


def test_an_upload_into_a_folder_that_leads_out_writes_nothing(world: World, alpha, planted) -> None:
    html = _html(
        _session(world.member_a).post(
            _url(alpha), {"action": "upload", "folder": "out", "up-file": SimpleUploadedFile("pwn.txt", b"pwned")}
        )
    )
    assert 'data-field="file"' in html
    assert sorted(p.name for p in planted.iterdir()) == ["secret.txt"]


def test_another_tenants_volume_answers_404_on_every_page(world: World, alpha) -> None:
    theirs = volumes.create_volume(
        actor=Actor(user=world.admin_b), tenant=world.tenant_b, kind="project", name="secret", project=world.project_b
    )
    Path(volume_files.ensure_directory(theirs), "plans.txt").write_bytes(b"plans")
    for user in (world.admin_a, world.operator):
        client = _session(user)
        assert client.get(_url(theirs)).status_code == 404
        assert client.get(f"{S}{theirs.pk}/download/?path=plans.txt").status_code == 404
        upload = {"action": "upload", "folder": "", "up-file": SimpleUploadedFile("x.txt", b"x")}
        assert client.post(_url(theirs), upload).status_code == 404
        assert client.post(_url(theirs), {"action": "delete", "folder": "", "path": "plans.txt"}).status_code == 404
    outsider = _session(world.admin_b)
    assert outsider.get(_url(alpha)).status_code == 404
    assert outsider.get(f"{S}{alpha.pk}/download/?path=hello.txt").status_code == 404
    assert _files(theirs) == {"plans.txt"} and _files(alpha) == {"hello.txt"}


def test_an_admin_sees_a_members_home_but_not_its_files(world: World) -> None:
    home = volumes.home_volume(tenant=world.tenant_a, user=world.member_a)
    Path(volume_files.ensure_directory(home), "diary.txt").write_bytes(b"dear diary")
    admin = _session(world.admin_a)
    html = _html(admin.get(_url(home)))
    assert "size only" in html and "diary.txt" not in html and 'id="files"' not in html
    assert admin.get(f"{S}{home.pk}/download/?path=diary.txt").status_code == 403
    assert _session(world.viewer_a).get(_url(home)).status_code == 404
    assert _session(world.member_a).get(f"{S}{home.pk}/download/?path=diary.txt").status_code == 200


def test_an_admin_shares_and_unshares_a_volume_through_the_page(world: World, alpha) -> None:
    Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    admin = _session(world.admin_a)
    shared = admin.post(_url(alpha), {"action": "share", "share-project": "gamma", "share-read_only": "on"})
    assert shared.status_code == 302
    share = VolumeShare.all_tenants.get(volume=alpha)
    assert (share.project.slug, share.read_only) == ("gamma", True)
    assert admin.post(_url(alpha), {"action": "unshare", "unshare-project": "gamma"}).status_code == 302
    assert not VolumeShare.all_tenants.exists()
    member = _session(world.member_a).post(_url(alpha), {"action": "share", "share-project": "gamma"})
    assert member.status_code == 403 and not VolumeShare.all_tenants.exists()


def test_a_volume_with_files_is_not_deleted_through_the_page(world: World, alpha) -> None:
    admin = _session(world.admin_a)
    html = _html(admin.post(_url(alpha), {"action": "delete_volume"}))
    assert "still holds files" in html
    assert Volume.all_tenants.filter(pk=alpha.pk).exists()
    (_dir(alpha) / "hello.txt").unlink()
    assert admin.post(_url(alpha), {"action": "delete_volume"})["Location"] == S
    assert not Volume.all_tenants.filter(pk=alpha.pk).exists()
