"""The storage API: volumes, shares, files and storage backends, held to their rights and quotas.

Personas beyond the world's: `member_a` works in alpha (a project member),
`colleague` is a member of tenant A in no project (a non-member of every
project), `viewer_a` reads alpha. Tenant A also has project `gamma`.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from inventory.api import volumes as volume_api
from inventory.drivers import storage
from inventory.models import StorageBackend, Volume, VolumeShare
from inventory.services import volume_files, volumes
from inventory.services.volume_access import host_path
from tenants.context import Actor
from tenants.models import Membership, Project, Tenant
from tests.conftest import PASSWORD, World, client_for
from tests.jobs.factories import assign

T = "/api/v1/tenants/tenant-a"


def _streamed(response: Any) -> bytes:
    """Return the whole body of a streamed response."""
    return b"".join(response.streaming_content)


def _found(pattern: str, text: str) -> str:
    """Return the first match of `pattern` in `text` (across lines); fail the test when there is none."""
    match = re.search(pattern, text, re.S)
    assert match is not None, pattern
    return match.group(0)


@pytest.fixture
def people(world: World) -> dict[str, User]:
    """The personas by role: owner and project member (member_a), colleague (no project), viewer, admin, ..."""
    colleague = User.objects.create_user("colleague", "colleague@example.com", PASSWORD)
    Membership.all_tenants.create(tenant=world.tenant_a, user=colleague, role="member")
    assign(world.member_a, world.project_a)
    assign(world.viewer_a, world.project_a)
    return {
        "member_a": world.member_a,
        "viewer_a": world.viewer_a,
        "colleague": colleague,
        "admin_a": world.admin_a,
        "operator": world.operator,
        "admin_b": world.admin_b,
    }


def _admin(world: World) -> Actor:
    return Actor(user=world.admin_a)


def _project(world: World, slug: str) -> Project:
    return Project.all_tenants.create(tenant=world.tenant_a, slug=slug, name=slug.title())


def _volume(world: World, name: str, *, kind: str = "project", project: Project | None = None) -> Volume:
    return volumes.create_volume(
        actor=_admin(world), tenant=world.tenant_a, kind=kind, name=name, project=project or world.project_a
    )


def _dir(volume: Volume) -> Path:
    return Path(host_path(volume.backend, volume, console=True))


def _put(client: APIClient, volume: Volume, path: str, body: bytes, tenant: str = "tenant-a") -> Any:
    url = f"/api/v1/tenants/{tenant}/volumes/{volume.pk}/files/content/?path={path}"
    return client.put(url, body, content_type="application/octet-stream")


def _error(response: Any) -> dict[str, Any]:
    return response.json()["error"]


def _files(volume: Volume) -> set[str]:
    """Every path below the volume's directory, temporary upload files included."""
    root = _dir(volume)
    if not root.exists():
        return set()
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# --- volumes: create, list, change, share, delete -----------------------------------


def test_a_tenant_admin_creates_project_volumes_and_datasets_and_members_list_them(world: World, people) -> None:
    admin = client_for(world.admin_a)
    body = {"kind": "project", "name": "scratch", "project": "alpha", "size_limit_bytes": 10}
    made = admin.post(f"{T}/volumes/", body, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["mount_path"] == "/projects/scratch"
    assert (made.json()["project"], made.json()["size_limit_bytes"], made.json()["can_write"]) == ("alpha", 10, True)
    data = admin.post(f"{T}/volumes/", {"kind": "dataset", "name": "imagenet", "project": "alpha"}, format="json")
    assert data.status_code == 201 and data.json()["mount_path"] == "/datasets/imagenet"
    listed = client_for(world.member_a).get(f"{T}/volumes/").json()["results"]
    assert {(v["name"], v["kind"], v["can_write"]) for v in listed} == {
        ("scratch", "project", True),
        ("imagenet", "dataset", True),
    }
    only = client_for(world.member_a).get(f"{T}/volumes/?kind=dataset").json()["results"]
    assert [v["name"] for v in only] == ["imagenet"]
    assert client_for(world.member_a).get(f"{T}/volumes/?project=gamma").json()["results"] == []
    assert client_for(world.member_a).get(f"{T}/volumes/?kind=bogus").status_code == 400


def test_members_may_not_create_volumes(world: World, people) -> None:
    response = client_for(world.member_a).post(
        f"{T}/volumes/", {"kind": "project", "name": "mine", "project": "alpha"}, format="json"
    )
    assert response.status_code == 403
    assert not Volume.all_tenants.exists()


def test_bad_volume_input_names_every_failing_field_at_once(world: World) -> None:
    admin = client_for(world.admin_a)
    response = admin.post(f"{T}/volumes/", {"kind": "project", "name": "Bad Name!"}, format="json")
    assert response.status_code == 400
    assert set(_error(response)["fields"]) == {"name", "project"}
    home = admin.post(f"{T}/volumes/", {"kind": "home", "name": "h"}, format="json")
    assert home.status_code == 400 and set(_error(home)["fields"]) == {"kind"}
    body = {"kind": "dataset", "name": "d", "size_limit_bytes": -1, "description": "x" * 201}
    negative = admin.post(f"{T}/volumes/", body, format="json")
    assert negative.status_code == 400 and set(_error(negative)["fields"]) == {"size_limit_bytes", "description"}
    foreign = admin.post(f"{T}/volumes/", {"kind": "project", "name": "p", "project": "beta"}, format="json")
    assert foreign.status_code == 400 and _error(foreign)["fields"]["project"][0]["code"] == "does_not_exist"
    assert not Volume.all_tenants.exists()


def test_a_volume_name_is_taken_once_per_tenant(world: World) -> None:
    _volume(world, "shared")
    again = client_for(world.admin_a).post(
        f"{T}/volumes/", {"kind": "dataset", "name": "shared", "project": "alpha"}, format="json"
    )
    assert again.status_code == 400 and set(_error(again)["fields"]) == {"name"}


def test_admins_change_the_description_and_limit_members_may_not(world: World, people) -> None:
    volume = _volume(world, "scratch")
    url = f"{T}/volumes/{volume.pk}/"
    assert client_for(world.member_a).patch(url, {"description": "x"}, format="json").status_code == 403
    changed = client_for(world.admin_a).patch(url, {"description": "Team data", "size_limit_bytes": 5}, format="json")
    assert changed.status_code == 200, changed.content
    assert (changed.json()["description"], changed.json()["size_limit_bytes"]) == ("Team data", 5)
    cleared = client_for(world.admin_a).patch(url, {"size_limit_bytes": None}, format="json")
    assert cleared.json()["size_limit_bytes"] is None
    refused = client_for(world.admin_a).patch(url, {"size_limit_bytes": -5, "description": "y" * 201}, format="json")
    assert refused.status_code == 400 and set(_error(refused)["fields"]) == {"size_limit_bytes", "description"}


def test_sharing_a_volume_lets_the_other_project_in_read_only_unless_said_otherwise(world: World, people) -> None:
    gamma = _project(world, "gamma")
    volume = _volume(world, "results", project=gamma)
    member = client_for(world.member_a)
    assert member.get(f"{T}/volumes/{volume.pk}/").status_code == 404, "alpha's member does not see gamma's volume"
    admin = client_for(world.admin_a)
    shared = admin.post(f"{T}/volumes/{volume.pk}/shares/", {"project": "alpha"}, format="json")
    assert shared.status_code == 201, shared.content
    assert shared.json()["read_only"] is True
    seen = member.get(f"{T}/volumes/{volume.pk}/").json()
    assert (seen["can_read"], seen["can_write"], seen["shares"][0]["project"]) == (True, False, "alpha")
    assert _put(member, volume, "x.txt", b"x").status_code == 403
    admin.post(f"{T}/volumes/{volume.pk}/shares/", {"project": "alpha", "read_only": False}, format="json")
    assert member.get(f"{T}/volumes/{volume.pk}/").json()["can_write"] is True
    assert _put(member, volume, "x.txt", b"x").status_code == 200
    assert [s["project"] for s in admin.get(f"{T}/volumes/{volume.pk}/shares/").json()] == ["alpha"]
    assert admin.delete(f"{T}/volumes/{volume.pk}/shares/alpha/").status_code == 204
    assert member.get(f"{T}/volumes/{volume.pk}/").status_code == 404
    assert admin.delete(f"{T}/volumes/{volume.pk}/shares/alpha/").status_code == 404


def test_shares_refuse_datasets_written_through_them_homes_and_foreign_projects(world: World, people) -> None:
    gamma = _project(world, "gamma")
    dataset = _volume(world, "corpus", kind="dataset", project=gamma)
    admin = client_for(world.admin_a)
    writable = admin.post(f"{T}/volumes/{dataset.pk}/shares/", {"project": "alpha", "read_only": False}, format="json")
    assert writable.status_code == 400 and set(_error(writable)["fields"]) == {"read_only"}
    home = volumes.home_volume(tenant=world.tenant_a, user=world.member_a)
    refused = admin.post(f"{T}/volumes/{home.pk}/shares/", {"project": "alpha"}, format="json")
    assert refused.status_code == 400 and set(_error(refused)["fields"]) == {"volume"}
    foreign = admin.post(f"{T}/volumes/{dataset.pk}/shares/", {"project": "beta"}, format="json")
    assert foreign.status_code == 400 and set(_error(foreign)["fields"]) == {"project"}
    assert (
        client_for(world.member_a)
        .post(f"{T}/volumes/{dataset.pk}/shares/", {"project": "alpha"}, format="json")
        .status_code
        == 403
    )
    assert not VolumeShare.all_tenants.exists()


def test_a_volume_is_deleted_only_when_empty_and_a_home_never(world: World, people) -> None:
    volume = _volume(world, "scratch")
    admin = client_for(world.admin_a)
    assert _put(admin, volume, "keep.txt", b"data").status_code == 200
    busy = admin.delete(f"{T}/volumes/{volume.pk}/")
    assert busy.status_code == 409 and _error(busy)["code"] == "volume_not_empty"
    assert admin.delete(f"{T}/volumes/{volume.pk}/files/?path=keep.txt").status_code == 200
    assert admin.delete(f"{T}/volumes/{volume.pk}/").status_code == 204
    assert not Volume.all_tenants.filter(pk=volume.pk).exists()
    home = volumes.home_volume(tenant=world.tenant_a, user=world.member_a)
    assert admin.delete(f"{T}/volumes/{home.pk}/").status_code == 409


def test_members_get_their_own_home_on_first_use_and_viewers_none(world: World, people) -> None:
    member = client_for(world.member_a)
    first = member.post(f"{T}/volumes/home/")
    assert first.status_code == 200, first.content
    home = first.json()
    assert (home["kind"], home["owner"], home["mount_path"]) == ("home", "member_a", "/home/member_a")
    assert member.post(f"{T}/volumes/home/").json()["id"] == first.json()["id"]
    assert client_for(world.viewer_a).post(f"{T}/volumes/home/").status_code == 403
    assert Volume.all_tenants.filter(kind="home").count() == 1


# --- the rights matrix --------------------------------------------------------------

# What each persona may do with each volume's files: "rw", "r", "hidden" (sees the volume, not its
# files: 403) or "404" (not even the volume; a viewer's writes are 403 by its role first).
MATRIX = {
    "home": {
        "member_a": "rw", "viewer_a": "404", "colleague": "404", "admin_a": "hidden", "operator": "hidden",
        "admin_b": "404",
    },
    "alpha-vol": {
        "member_a": "rw", "viewer_a": "r", "colleague": "404", "admin_a": "rw", "operator": "rw", "admin_b": "404",
    },
    "alpha-data": {
        "member_a": "rw", "viewer_a": "r", "colleague": "404", "admin_a": "rw", "operator": "rw", "admin_b": "404",
    },
    "gamma-shared-ro": {
        "member_a": "r", "viewer_a": "r", "colleague": "404", "admin_a": "rw", "operator": "rw", "admin_b": "404",
    },
    "gamma-private": {
        "member_a": "404", "viewer_a": "404", "colleague": "404", "admin_a": "rw", "operator": "rw",
        "admin_b": "404",
    },
}  # fmt: skip


def _matrix_volumes(world: World) -> dict[str, Volume]:
    gamma = _project(world, "gamma")
    made = {
        "home": volumes.home_volume(tenant=world.tenant_a, user=world.member_a),
        "alpha-vol": _volume(world, "alpha-vol"),
        "alpha-data": _volume(world, "alpha-data", kind="dataset"),
        "gamma-shared-ro": _volume(world, "gamma-shared-ro", project=gamma),
        "gamma-private": _volume(world, "gamma-private", project=gamma),
    }
    volumes.share_volume(actor=_admin(world), volume=made["gamma-shared-ro"], project=world.project_a)
    for volume in made.values():
        volume_files.ensure_directory(volume)
        (_dir(volume) / "seed.txt").write_bytes(b"seed")
    return made


@pytest.mark.parametrize("persona", ["member_a", "viewer_a", "colleague", "admin_a", "operator", "admin_b"])
def test_each_persona_reads_and_writes_exactly_the_files_its_rights_allow(world: World, people, persona: str) -> None:
    made = _matrix_volumes(world)
    client = client_for(people[persona])
    for name, volume in made.items():
        expected = MATRIX[name][persona]
        base = f"{T}/volumes/{volume.pk}"
        detail = client.get(f"{base}/")
        listing = client.get(f"{base}/files/")
        download = client.get(f"{base}/files/content/?path=seed.txt")
        upload = _put(client, volume, "new.txt", b"new")
        folder = client.post(f"{base}/files/folders/", {"path": "dir"}, format="json")
        removal = client.delete(f"{base}/files/?path=seed.txt")
        writes = [upload.status_code, folder.status_code, removal.status_code]
        where = (persona, name)
        if expected == "404":
            assert [detail.status_code, listing.status_code, download.status_code] == [404] * 3, where
            # A viewer's write is refused by its role before any volume is looked up: 403, revealing nothing.
            assert writes == [403 if persona == "viewer_a" else 404] * 3, where
        elif expected == "hidden":
            assert detail.status_code == 200 and detail.json()["can_read"] is False, where
            assert [listing.status_code, download.status_code, *writes] == [403] * 5, where
        elif expected == "r":
            assert (listing.status_code, download.status_code) == (200, 200), where
            assert _streamed(download) == b"seed", where
            assert writes == [403, 403, 403], where
        else:
            assert (listing.status_code, download.status_code) == (200, 200), where
            assert writes == [200, 201, 200], where
        written = _files(volume)
        assert ("new.txt" in written) == (expected == "rw"), where
        assert ("seed.txt" in written) == (expected != "rw"), where


def test_another_tenants_volume_is_not_found_even_by_id_under_ones_own_tenant(world: World, people) -> None:
    theirs = volumes.create_volume(
        actor=Actor(user=world.admin_b), tenant=world.tenant_b, kind="project", name="secret", project=world.project_b
    )
    volume_files.ensure_directory(theirs)
    (_dir(theirs) / "plans.txt").write_bytes(b"plans")
    for client in (client_for(world.admin_a), client_for(world.operator)):
        base = f"{T}/volumes/{theirs.pk}"
        assert client.get(f"{base}/").status_code == 404
        assert client.get(f"{base}/files/").status_code == 404
        assert client.get(f"{base}/files/content/?path=plans.txt").status_code == 404
        assert _put(client, theirs, "x", b"x").status_code == 404
        assert client.delete(f"{base}/files/?path=plans.txt").status_code == 404
        assert client.post(f"{base}/shares/", {"project": "alpha"}, format="json").status_code == 404
    assert _files(theirs) == {"plans.txt"}


# --- files: listing, download, upload ----------------------------------------------


def test_a_folder_of_10000_files_is_listed_page_by_page_in_name_order(world: World, people) -> None:
    volume = _volume(world, "many")
    root = Path(volume_files.ensure_directory(volume))
    (root / "sub").mkdir()
    names = sorted(f"f{i:05d}.bin" for i in range(10_000))
    for name in names:
        (root / "sub" / name).touch()
    client = client_for(world.member_a)
    seen: list[str] = []
    offset = 0
    while True:
        page = client.get(f"{T}/volumes/{volume.pk}/files/?path=sub&limit=200&offset={offset}")
        assert page.status_code == 200, page.content
        body = page.json()
        assert len(body["entries"]) <= 200
        seen += [entry["name"] for entry in body["entries"]]
        assert all(entry["path"] == f"sub/{entry['name']}" for entry in body["entries"])
        if not body["more"]:
            break
        offset += 200
    assert seen == names
    assert offset == 9800
    assert client.get(f"{T}/volumes/{volume.pk}/files/?path=sub&limit=1001").status_code == 400


def test_a_listing_shows_files_folders_and_links_without_following_links(world: World, people, tmp_path) -> None:
    volume = _volume(world, "kinds")
    root = Path(volume_files.ensure_directory(volume))
    (root / "a.txt").write_bytes(b"12345")
    (root / "folder").mkdir()
    (root / "out").symlink_to(tmp_path)
    entries = client_for(world.member_a).get(f"{T}/volumes/{volume.pk}/files/").json()["entries"]
    assert [(e["name"], e["kind"], e["size"]) for e in entries if e["kind"] != "link"] == [
        ("a.txt", "file", 5),
        ("folder", "dir", 0),
    ]
    assert [e["name"] for e in entries if e["kind"] == "link"] == ["out"]


def test_a_download_streams_the_file_as_an_attachment(world: World, people) -> None:
    volume = _volume(world, "dl")
    root = Path(volume_files.ensure_directory(volume))
    payload = os.urandom(3 * volume_api.CHUNK + 17)
    (root / "model.bin").write_bytes(payload)
    response = client_for(world.viewer_a).get(f"{T}/volumes/{volume.pk}/files/content/?path=model.bin")
    assert response.status_code == 200
    assert response.streaming, "the file is streamed, never read whole into memory"
    assert response["Content-Disposition"] == 'attachment; filename="model.bin"'
    assert response["Content-Type"] == "application/octet-stream"
    assert int(response["Content-Length"]) == len(payload)
    chunks: list[bytes] = list(getattr(response, "streaming_content"))  # noqa: B009 -- absent from the stubs
    assert len(chunks) > 1 and max(len(c) for c in chunks) <= volume_api.CHUNK
    assert b"".join(chunks) == payload
    missing = client_for(world.viewer_a).get(f"{T}/volumes/{volume.pk}/files/content/?path=nope.bin")
    assert missing.status_code == 404 and "nope.bin" in _error(missing)["message"]
    folder = client_for(world.viewer_a).get(f"{T}/volumes/{volume.pk}/files/content/?path=")
    assert folder.status_code == 400 and set(_error(folder)["fields"]) == {"path"}


@pytest.fixture
def spy(monkeypatch) -> list[int]:
    """Record the size of every chunk the storage driver receives for an upload."""
    sizes: list[int] = []
    real = storage.write_file

    def write_file(volume_dir: str, rel: str, chunks: Any, max_bytes: int) -> int:
        def counted() -> Iterator[bytes]:
            for chunk in chunks:
                sizes.append(len(chunk))
                yield chunk

        return real(volume_dir, rel, counted(), max_bytes)

    monkeypatch.setattr(storage, "write_file", write_file)
    return sizes


def test_an_upload_is_streamed_from_the_body_in_chunks_never_read_whole(world: World, people, spy, monkeypatch) -> None:
    from django.http import HttpRequest

    def body_refused(self: HttpRequest) -> bytes:
        raise AssertionError("the upload read request.body: the whole file in memory")

    monkeypatch.setattr(HttpRequest, "body", property(body_refused))
    volume = _volume(world, "up")
    payload = os.urandom(3 * volume_api.CHUNK + 5)
    response = _put(client_for(world.member_a), volume, "weights.bin", payload)
    assert response.status_code == 200, response.content
    assert response.json() == {"path": "weights.bin", "size": len(payload)}
    assert len(spy) >= 4 and max(spy) <= volume_api.CHUNK
    assert (_dir(volume) / "weights.bin").read_bytes() == payload
    assert Volume.all_tenants.get(pk=volume.pk).used_bytes == len(payload)


def test_an_upload_replaces_a_file_and_counts_only_the_difference(world: World, people) -> None:
    volume = _volume(world, "up")
    client = client_for(world.member_a)
    assert _put(client, volume, "a.txt", b"x" * 100).status_code == 200
    assert _put(client, volume, "a.txt", b"y" * 40).status_code == 200
    assert (_dir(volume) / "a.txt").read_bytes() == b"y" * 40
    assert Volume.all_tenants.get(pk=volume.pk).used_bytes == 40


def test_an_upload_into_a_missing_folder_or_onto_a_folder_is_refused(world: World, people) -> None:
    volume = _volume(world, "up")
    client = client_for(world.member_a)
    assert _put(client, volume, "no/such/dir/a.txt", b"x").status_code == 404
    assert client.post(f"{T}/volumes/{volume.pk}/files/folders/", {"path": "d"}, format="json").status_code == 201
    onto = _put(client, volume, "d", b"x")
    assert onto.status_code == 409
    assert _files(volume) == {"d"}


def _quota_refused(response: Any, rule: str) -> None:
    assert response.status_code == 413, response.content
    error = _error(response)
    assert error["code"] == "too_large"
    assert [item["code"] for item in error["fields"]["file"]] == [rule]


def _cap(world: World, settings: Any, volume: Volume) -> None:
    settings.VOLUME_UPLOAD_MAX_BYTES = 1000


def _volume_limit(world: World, settings: Any, volume: Volume) -> None:
    Volume.all_tenants.filter(pk=volume.pk).update(size_limit_bytes=1000)


def _project_quota(world: World, settings: Any, volume: Volume) -> None:
    Project.all_tenants.filter(pk=world.project_a.pk).update(storage_limit_bytes=1000)


def _tenant_quota(world: World, settings: Any, volume: Volume) -> None:
    Tenant.objects.filter(pk=world.tenant_a.pk).update(storage_limit_bytes=1000)


@pytest.mark.parametrize(
    ("rule", "arrange"),
    [
        ("upload_limit", _cap),
        ("volume_limit", _volume_limit),
        ("project_quota", _project_quota),
        ("tenant_quota", _tenant_quota),
    ],
)
def test_an_upload_over_the_room_left_is_413_naming_file_and_the_rule_and_writes_nothing(
    world: World, people, settings, rule: str, arrange: Any
) -> None:
    volume = _volume(world, "up")
    arrange(world, settings, volume)
    client = client_for(world.member_a)
    assert _put(client, volume, "fits.bin", b"x" * 600).status_code == 200
    _quota_refused(_put(client, volume, "big.bin", b"x" * 1001), rule)
    if rule != "upload_limit":
        _quota_refused(_put(client, volume, "second.bin", b"x" * 401), rule)  # 600 are used of the 1000
        assert _put(client, volume, "fits.bin", b"x" * 1000).status_code == 200, "replacing frees the old size"
    assert _files(volume) == {"fits.bin"}, "nothing of a refused upload is left, not even a temporary file"


def test_a_home_is_held_to_the_tenants_home_limit(world: World, people) -> None:
    Tenant.objects.filter(pk=world.tenant_a.pk).update(home_limit_bytes=100)
    home = volumes.home_volume(tenant=world.tenant_a, user=world.member_a)
    client = client_for(world.member_a)
    assert _put(client, home, "notes.txt", b"n" * 100).status_code == 200
    _quota_refused(_put(client, home, "more.txt", b"m"), "home_limit")
    assert _files(home) == {"notes.txt"}


def test_the_tenants_quota_counts_every_volume_of_the_tenant(world: World, people) -> None:
    Tenant.objects.filter(pk=world.tenant_a.pk).update(storage_limit_bytes=1000)
    first, second = _volume(world, "one"), _volume(world, "two")
    client = client_for(world.member_a)
    assert _put(client, first, "a.bin", b"a" * 700).status_code == 200
    _quota_refused(_put(client, second, "b.bin", b"b" * 301), "tenant_quota")
    assert _put(client, second, "b.bin", b"b" * 300).status_code == 200
    assert client.delete(f"{T}/volumes/{first.pk}/files/?path=a.bin").json() == {"path": "a.bin", "freed_bytes": 700}
    assert _put(client, second, "c.bin", b"c" * 700).status_code == 200, "a delete gives the room back"


def test_an_upload_without_a_length_or_in_chunks_is_refused_before_it_is_read(world: World, people) -> None:
    volume = _volume(world, "up")
    url = f"{T}/volumes/{volume.pk}/files/content/?path=x.bin"
    client: Any = client_for(world.member_a)  # the stubs want a str body; the test sends bytes
    chunked = client.generic(
        "PUT", url, b"5\r\nhello\r\n0\r\n\r\n", content_type="application/octet-stream",
        HTTP_TRANSFER_ENCODING="chunked",
    )  # fmt: skip
    unsized = client.generic(
        "PUT",
        url,
        b"",
        content_type="application/octet-stream",
        **{"CONTENT_LENGTH": "", "wsgi.input": io.BytesIO(b"x")},
    )
    for response in (chunked, unsized):
        assert response.status_code == 400, response.content
        assert set(_error(response)["fields"]) == {"file"}
    assert _files(volume) == set()


def test_an_upload_shorter_than_its_content_length_writes_nothing(world: World, people) -> None:
    volume = _volume(world, "up")
    client: Any = client_for(world.member_a)
    response = client.generic(
        "PUT",
        f"{T}/volumes/{volume.pk}/files/content/?path=cut.bin",
        b"only this",
        content_type="application/octet-stream",
        # The client went away after 9 of the 100 bytes it announced.
        **{"CONTENT_LENGTH": "100", "wsgi.input": io.BytesIO(b"only this")},
    )
    assert response.status_code == 400
    assert set(_error(response)["fields"]) == {"file"}
    assert _files(volume) == set()


# --- paths that lead out ---------------------------------------------------------------


@pytest.fixture
def planted(world: World, people, tmp_path: Path) -> tuple[Volume, Path]:
    """A volume holding `out`, a symlink to a directory outside it, and `passwd`, one to a file outside it."""
    volume = _volume(world, "trap")
    root = Path(volume_files.ensure_directory(volume))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"secret")
    (root / "out").symlink_to(outside)
    (root / "passwd").symlink_to(outside / "secret.txt")
    return volume, outside


TRAVERSALS = ["../x", "/etc/passwd", "a/../../x", "out/x", "out/secret.txt", "passwd", "..", "x\x00y"]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_paths_that_lead_out_of_the_volume_are_400_naming_path_and_touch_nothing(
    world: World, planted, path: str
) -> None:
    volume, outside = planted
    client = client_for(world.member_a)
    base = f"{T}/volumes/{volume.pk}/files"
    from urllib.parse import quote

    q = quote(path)
    responses = [
        client.get(f"{base}/?path={q}"),
        client.get(f"{base}/content/?path={q}"),
        client.put(f"{base}/content/?path={q}", b"pwned", content_type="application/octet-stream"),
        client.post(f"{base}/folders/", {"path": path}, format="json"),
    ]
    if path != "passwd":  # deleting the link itself is allowed: see below
        responses.append(client.delete(f"{base}/?path={q}"))
    for response in responses:
        assert response.status_code == 400, (path, response.status_code, response.content)
        assert "path" in _error(response)["fields"], (path, response.content)
        assert b"secret" not in response.content
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_bytes() == b"secret"
    assert _files(volume) == {"out", "passwd"}


def test_deleting_a_planted_link_removes_the_link_never_its_target(world: World, planted) -> None:
    volume, outside = planted
    response = client_for(world.member_a).delete(f"{T}/volumes/{volume.pk}/files/?path=out")
    assert response.status_code == 200, response.content
    assert response.json()["freed_bytes"] == 0
    assert (outside / "secret.txt").read_bytes() == b"secret"
    assert _files(volume) == {"passwd"}


def test_folders_are_made_with_their_parents_and_deleted_with_their_contents(world: World, people) -> None:
    volume = _volume(world, "tree")
    client = client_for(world.member_a)
    base = f"{T}/volumes/{volume.pk}/files"
    assert client.post(f"{base}/folders/", {"path": "a/b/c"}, format="json").status_code == 201
    again = client.post(f"{base}/folders/", {"path": "a/b/c"}, format="json")
    assert again.status_code == 409
    assert _put(client, volume, "a/b/c/d.bin", b"d" * 10).status_code == 200
    assert _put(client, volume, "a/e.bin", b"e" * 5).status_code == 200
    through_file = client.post(f"{base}/folders/", {"path": "a/e.bin/f"}, format="json")
    assert through_file.status_code == 409
    gone = client.delete(f"{base}/?path=a")
    assert gone.json() == {"path": "a", "freed_bytes": 15}
    assert _files(volume) == set()
    assert client.delete(f"{base}/?path=a").status_code == 404
    assert client.delete(f"{base}/?path=").status_code == 400, "the volume itself is not deleted through its files"


# --- storage quotas on tenants and projects -------------------------------------------


def test_operators_set_the_tenants_storage_quotas_and_bad_values_name_each_field(world: World) -> None:
    operator = client_for(world.operator)
    url = "/api/v1/tenants/tenant-a/"
    bad = operator.patch(url, {"storage_limit_bytes": -1, "home_limit_bytes": "lots"}, format="json")
    assert bad.status_code == 400
    assert set(_error(bad)["fields"]) == {"storage_limit_bytes", "home_limit_bytes"}
    good = operator.patch(url, {"storage_limit_bytes": 10**12, "home_limit_bytes": 10**10}, format="json")
    assert good.status_code == 200, good.content
    assert (good.json()["storage_limit_bytes"], good.json()["home_limit_bytes"]) == (10**12, 10**10)
    cleared = operator.patch(url, {"home_limit_bytes": None}, format="json").json()
    assert (cleared["storage_limit_bytes"], cleared["home_limit_bytes"]) == (10**12, None)
    assert client_for(world.admin_a).patch(url, {"storage_limit_bytes": 1}, format="json").status_code == 403
    assert Tenant.objects.get(pk=world.tenant_a.pk).storage_limit_bytes == 10**12


def test_tenant_admins_set_a_projects_storage_quota_within_the_tenants(world: World) -> None:
    admin = client_for(world.admin_a)
    url = f"{T}/projects/alpha/"
    bad = admin.patch(url, {"storage_limit_bytes": -5}, format="json")
    assert bad.status_code == 400 and set(_error(bad)["fields"]) == {"storage_limit_bytes"}
    assert admin.patch(url, {"storage_limit_bytes": 500}, format="json").json()["storage_limit_bytes"] == 500
    Tenant.objects.filter(pk=world.tenant_a.pk).update(storage_limit_bytes=1000)
    above = admin.patch(url, {"storage_limit_bytes": 1001}, format="json")
    assert above.status_code == 400
    assert _error(above)["fields"]["storage_limit_bytes"][0]["code"] == "above_tenant_limit"
    assert client_for(world.member_a).patch(url, {"storage_limit_bytes": 1}, format="json").status_code == 403
    assert Project.all_tenants.get(pk=world.project_a.pk).storage_limit_bytes == 500


# --- storage backends (operators) -----------------------------------------------------


def test_operators_manage_storage_backends_and_nobody_else_sees_them(world: World, tmp_path: Path) -> None:
    operator = client_for(world.operator)
    root = tmp_path / "nfs"
    made = operator.post("/api/v1/storage-backends/", {"name": "nfs", "path": str(root)}, format="json")
    assert made.status_code == 201, made.content
    assert (made.json()["kind"], made.json()["path"]) == ("shared", str(root))
    marker = StorageBackend.objects.get(name="nfs").marker
    assert (root / ".gpucloud-storage").read_text().strip() == marker
    assert [b["name"] for b in operator.get("/api/v1/storage-backends/").json()["results"]] == ["nfs"]
    for user in (world.admin_a, world.member_a):
        assert client_for(user).get("/api/v1/storage-backends/").status_code == 403
        refused = client_for(user).post("/api/v1/storage-backends/", {"name": "x", "path": "/x"}, format="json")
        assert refused.status_code == 403
    bad = operator.post("/api/v1/storage-backends/", {"name": "Bad!", "kind": "local", "path": "rel"}, format="json")
    assert bad.status_code == 400 and set(_error(bad)["fields"]) == {"name", "node", "path"}
    assert operator.delete("/api/v1/storage-backends/nfs/").status_code == 204
    assert not StorageBackend.objects.filter(name="nfs").exists()


def test_a_backend_holding_volumes_cannot_be_deleted(world: World) -> None:
    volume = _volume(world, "scratch")
    response = client_for(world.operator).delete(f"/api/v1/storage-backends/{volume.backend.name}/")
    assert response.status_code == 409 and _error(response)["code"] == "backend_in_use"


def test_a_backend_the_console_cannot_reach_is_503_and_nothing_is_written(world: World, people, tmp_path) -> None:
    volume = _volume(world, "far")
    (Path(volume.backend.console_root) / ".gpucloud-storage").unlink()
    response = _put(client_for(world.member_a), volume, "a.txt", b"x")
    assert response.status_code == 503, response.content
    assert _error(response)["code"] == "storage_unavailable"
    assert str(volume.backend.console_root) not in response.content.decode()
    assert _files(volume) == set()


# However many volumes and shares: a member pays one more query than an admin (its projects).
@pytest.mark.parametrize(("who", "pinned"), [("admin_a", 7), ("member_a", 8)])
def test_the_volume_list_answers_in_a_pinned_number_of_queries(world: World, people, who: str, pinned: int) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    gamma = _project(world, "gamma")
    client = client_for(people[who])

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(f"{T}/volumes/").status_code == 200
        return len(queries)

    def grow(start: int, n: int) -> None:
        for i in range(start, start + n):
            volume = _volume(world, f"v{i}")
            volumes.share_volume(actor=_admin(world), volume=volume, project=gamma)

    grow(0, 3)
    few = count()
    grow(3, 10)
    assert (few, count()) == (pinned, pinned)
