"""Storage drivers on real directories: preparing volumes, confinement of every file operation, uploads, usage."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inventory.drivers import storage
from inventory.drivers.base import Mount, RunAs
from inventory.drivers.storage import (
    MARKER_FILE,
    Conflict,
    LocalDirectory,
    NotFound,
    PathRefused,
    SharedFilesystem,
    Storage,
    StorageNotMounted,
    TooLarge,
    split_relative,
)
from inventory.drivers.storage import _paths as storage_paths
from inventory.drivers.storage._paths import MAX_DEPTH

# Giving files to another uid needs root: without it these fail, never skip.
ROOT_ONLY = pytest.mark.usefixtures("as_root")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside every volume, holding a secret no file operation may reach."""
    place = tmp_path / "outside"
    place.mkdir()
    (place / "secret").write_text("top secret")
    return place


@pytest.fixture
def volume(tmp_path: Path) -> str:
    root = tmp_path / "root"
    return LocalDirectory().prepare(Mount(str(root / "tenant" / "vol"), "/home/a", root=str(root)))


def upload(volume: str, rel: str, data: bytes, max_bytes: int = 1 << 20) -> int:
    return storage.write_file(volume, rel, [data[i : i + 4096] for i in range(0, len(data), 4096)], max_bytes)


def names(volume: str, rel: str = "") -> list[str]:
    return [entry.name for entry in storage.list_dir(volume, rel)]


# --- drivers and preparing ------------------------------------------------------------


def test_both_drivers_are_storages() -> None:
    assert isinstance(LocalDirectory(), Storage) and isinstance(SharedFilesystem(), Storage)
    assert isinstance(storage.storage_for(Mount("/r/v", "/t", root="/r", marker="m")), SharedFilesystem)
    assert isinstance(storage.storage_for(Mount("/r/v", "/t", root="/r")), LocalDirectory)


@ROOT_ONLY
def test_prepare_makes_the_volume_with_its_owner_and_mode_and_keeps_an_existing_one(tmp_path: Path) -> None:
    root = tmp_path / "root"
    mount = Mount(str(root / "t1" / "homes" / "alice"), "/home/alice", root=str(root), mode=0o2770)
    made = LocalDirectory().prepare(mount, RunAs(1234, 2345))
    assert made == str(root / "t1" / "homes" / "alice")
    found = os.stat(made)
    assert (found.st_uid, found.st_gid, stat.S_IMODE(found.st_mode)) == (1234, 2345, 0o2770)
    assert stat.S_IMODE(os.stat(root / "t1").st_mode) == 0o711, "the way there lets through, lists nothing"
    # The mount's own owner wins over the user it runs as; an existing volume keeps its owner.
    own = Mount(str(root / "t1" / "p"), "/projects/p", root=str(root), uid=0, gid=3000, mode=0o2770)
    assert os.stat(LocalDirectory().prepare(own, RunAs(1234, 2345))).st_gid == 3000
    LocalDirectory().prepare(mount, RunAs(999, 999))
    assert os.stat(made).st_uid == 1234


@ROOT_ONLY
def test_a_volume_directory_made_by_someone_else_gets_the_owner_its_mount_states(tmp_path: Path) -> None:
    # A console not running as root made alice's home under its own user; the agent (root) puts it right.
    root = tmp_path / "root"
    home = root / "t1" / "home" / "alice"
    home.mkdir(parents=True)
    os.chown(home, 4321, 4321)
    home.chmod(0o755)
    mount = Mount(str(home), "/home/alice", root=str(root), uid=1001, gid=1001, mode=0o700)
    found = os.stat(LocalDirectory().prepare(mount))
    assert (found.st_uid, found.st_gid, stat.S_IMODE(found.st_mode)) == (1001, 1001, 0o700)
    assert stat.S_IMODE(os.stat(root / "t1").st_mode) == 0o755, "only the volume's own directory is changed"


def test_prepare_refuses_a_symlink_below_the_root_and_a_source_outside_it(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "t1").symlink_to(outside)
    with pytest.raises(PathRefused, match="symbolic link"):
        LocalDirectory().prepare(Mount(str(root / "t1" / "vol"), "/home/a", root=str(root)))
    assert sorted(os.listdir(outside)) == ["secret"], "nothing was made through the link"
    for source in (str(outside), str(root), str(root / ".." / "outside" / "x")):
        with pytest.raises(PathRefused, match="not below its storage root"):
            LocalDirectory().prepare(Mount(source, "/home/a", root=str(root)))


def test_a_shared_filesystem_without_its_marker_is_not_mounted_here(tmp_path: Path) -> None:
    root = tmp_path / "share"
    root.mkdir()
    mount = Mount(str(root / "vol"), "/home/a", root=str(root), marker="backend-42")
    expected = f"storage {root} is not mounted on this host: no marker at {root}/{MARKER_FILE}"
    with pytest.raises(StorageNotMounted, match=expected) as refused:
        SharedFilesystem().prepare(mount)
    assert refused.value.code == "storage_not_mounted"
    assert not (root / "vol").exists(), "nothing is made on the local disk under an unmounted share"
    (root / MARKER_FILE).write_text("backend-7\n")
    with pytest.raises(StorageNotMounted, match="holds another marker"):
        SharedFilesystem().prepare(mount)
    (root / MARKER_FILE).write_text("backend-42\n")
    assert SharedFilesystem().prepare(mount) == str(root / "vol")


def test_the_mode_is_the_mounts_else_the_callers_and_the_target_does_not_matter(tmp_path: Path) -> None:
    root = tmp_path / "share"
    root.mkdir()
    (root / MARKER_FILE).write_text("m1\n")
    made = SharedFilesystem().prepare(Mount(str(root / "t" / "v"), "/", root=str(root), marker="m1"), None, 0o700)
    assert made == str(root / "t" / "v") and stat.S_IMODE(os.stat(made).st_mode) == 0o700
    own = SharedFilesystem().prepare(Mount(str(root / "t" / "w"), "/", root=str(root), marker="m1", mode=0o750))
    assert stat.S_IMODE(os.stat(own).st_mode) == 0o750


# --- confinement ------------------------------------------------------------------------


@pytest.mark.parametrize("rel", ["/etc/passwd", "..", "../x", "a/../../x", "a/..", "a\0b", "x" * 256])
def test_absolute_climbing_nul_and_overlong_paths_are_refused(volume: str, rel: str) -> None:
    for call in (
        lambda: storage.list_dir(volume, rel),
        lambda: storage.open_read(volume, rel),
        lambda: upload(volume, rel, b"x"),
        lambda: storage.make_dir(volume, rel),
        lambda: storage.delete(volume, rel),
    ):
        with pytest.raises(PathRefused) as refused:
            call()
        assert refused.value.code == "path_refused"


def test_paths_are_normalised_without_leaving_the_volume() -> None:
    assert split_relative("a//b/./c/") == ["a", "b", "c"]
    assert split_relative("") == split_relative(".") == []


def test_a_symlink_planted_inside_the_volume_is_never_followed(volume: str, outside: Path) -> None:
    os.symlink("/etc", os.path.join(volume, "etc"))
    os.symlink(outside, os.path.join(volume, "out"))
    os.symlink(outside / "secret", os.path.join(volume, "secret"))
    for call in (
        lambda: storage.list_dir(volume, "etc"),
        lambda: storage.open_read(volume, "etc/passwd"),
        lambda: storage.open_read(volume, "secret"),
        lambda: storage.file_size(volume, "secret"),
        lambda: upload(volume, "out/new", b"x"),
        lambda: storage.make_dir(volume, "out/new"),
        lambda: storage.delete(volume, "out/secret"),
    ):
        with pytest.raises(PathRefused, match="symbolic link"):
            call()
    listed = {entry.name: entry.kind for entry in storage.list_dir(volume)}
    assert listed == {"etc": "link", "out": "link", "secret": "link"}
    assert storage.delete(volume, "out") == 0, "a link is deleted itself, its target untouched"
    assert sorted(os.listdir(outside)) == ["secret"] and not os.path.lexists(os.path.join(volume, "out"))


def test_a_directory_swapped_for_a_symlink_in_the_middle_of_the_walk_leads_nowhere(
    volume: str, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Path(volume, "a")
    real.mkdir()
    (real / "secret").write_text("mine")
    opened = os.open

    def swapping(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = opened(path, flags, mode, dir_fd=dir_fd)
        if path == "a" and dir_fd is not None and not real.is_symlink():
            real.rename(Path(volume, "a-moved"))
            real.symlink_to(outside)  # the workload's swap, just after the walk opened `a`
        return fd

    monkeypatch.setattr(os, "open", swapping)
    with storage.open_read(volume, "a/secret") as file:
        assert file.read() == b"mine", "the walk goes on in the directory it opened"
    monkeypatch.undo()
    with pytest.raises(PathRefused):
        storage.open_read(volume, "a/secret")


def test_a_workload_swapping_links_in_a_loop_never_shows_the_console_anything_outside(
    volume: str, outside: Path
) -> None:
    Path(volume, "real").mkdir()
    Path(volume, "real", "inside").write_text("inside")
    os.symlink(outside, os.path.join(volume, "link"))
    done = threading.Event()

    def swap() -> None:
        while not done.is_set():
            for name in ("real", "link"):
                os.rename(os.path.join(volume, name), os.path.join(volume, "a"))
                os.rename(os.path.join(volume, "a"), os.path.join(volume, name))

    swapper = threading.Thread(target=swap)
    swapper.start()
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            for rel in ("a", "a/inside", "a/secret"):
                try:
                    if rel == "a":
                        seen.update(names(volume, rel))
                    else:
                        with storage.open_read(volume, rel) as file:
                            seen.add(file.read().decode())
                except (PathRefused, NotFound, Conflict):
                    pass
    finally:
        done.set()
        swapper.join()
    assert "secret" not in seen and "top secret" not in seen
    assert seen, "the race let some reads through the real directory"


def test_a_fifo_is_refused_at_once_instead_of_hanging_the_reader(volume: str) -> None:
    os.mkfifo(os.path.join(volume, "pipe"))
    with pytest.raises(Conflict, match="not a regular file"):
        storage.open_read(volume, "pipe")


# --- uploads ----------------------------------------------------------------------------


def test_an_upload_replaces_the_file_whole(volume: str) -> None:
    assert upload(volume, "data.bin", b"old") == 3
    assert upload(volume, "data.bin", b"n" * 10_000) == 10_000
    with storage.open_read(volume, "data.bin") as file:
        assert file.read() == b"n" * 10_000 and os.fstat(file.fileno()).st_size == 10_000
    assert names(volume) == ["data.bin"], "no temporary file is left"
    assert storage.file_size(volume, "data.bin") == 10_000 and storage.file_size(volume, "missing") == 0


def test_an_oversize_upload_writes_nothing_and_keeps_the_old_file(volume: str) -> None:
    upload(volume, "model.pt", b"old")
    with pytest.raises(TooLarge, match="over the limit of 5000 bytes") as refused:
        upload(volume, "model.pt", b"x" * 10_000, max_bytes=5000)
    assert refused.value.code == "too_large"
    with pytest.raises(TooLarge):
        upload(volume, "new.pt", b"x" * 10_000, max_bytes=5000)
    assert names(volume) == ["model.pt"]
    assert Path(volume, "model.pt").read_bytes() == b"old"


def test_an_upload_cut_short_writes_nothing(volume: str) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"first part"
        raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError):
        storage.write_file(volume, "partial.txt", chunks(), 1 << 20)
    assert names(volume) == []


def test_an_upload_over_a_directory_or_into_a_missing_one_is_refused(volume: str) -> None:
    storage.make_dir(volume, "folder")
    with pytest.raises(Conflict):
        upload(volume, "folder", b"x")
    with pytest.raises(NotFound):
        upload(volume, "missing/file", b"x")
    assert names(volume) == ["folder"] and names(volume, "folder") == []


@ROOT_ONLY
def test_what_the_console_writes_belongs_to_the_volume_owner_and_group(tmp_path: Path) -> None:
    root = tmp_path / "root"
    project = Mount(str(root / "p"), "/projects/p", root=str(root), uid=0, gid=3001, mode=0o2770)
    volume = LocalDirectory().prepare(project)
    storage.make_dir(volume, "a/b")
    upload(volume, "a/b/file", b"x")
    for rel in ("a", "a/b", "a/b/file"):
        found = os.stat(os.path.join(volume, rel))
        assert (found.st_uid, found.st_gid) == (0, 3001), rel
    assert os.stat(os.path.join(volume, "a")).st_mode & stat.S_ISGID, "folders keep the project's group"
    home = LocalDirectory().prepare(Mount(str(root / "h"), "/home/h", root=str(root)), RunAs(1500, 1500))
    upload(home, "notes", b"x")
    assert (os.stat(os.path.join(home, "notes")).st_uid, os.stat(os.path.join(home, "notes")).st_gid) == (1500, 1500)


# --- folders, deleting, listing, usage ------------------------------------------------


def test_make_dir_makes_the_parents_and_refuses_what_exists(volume: str) -> None:
    storage.make_dir(volume, "a/b/c")
    assert names(volume, "a/b") == ["c"]
    with pytest.raises(Conflict, match="exists"):
        storage.make_dir(volume, "a/b/c")
    with pytest.raises(PathRefused):
        storage.make_dir(volume, "")


def test_delete_removes_a_file_or_a_tree_and_says_how_much_it_freed(volume: str) -> None:
    storage.make_dir(volume, "tree/deep")
    upload(volume, "tree/one", b"1" * 100)
    upload(volume, "tree/deep/two", b"2" * 50)
    upload(volume, "keep", b"k" * 7)
    assert storage.delete(volume, "tree") == 150
    assert storage.delete(volume, "keep") == 7
    assert names(volume) == []
    with pytest.raises(NotFound):
        storage.delete(volume, "keep")
    with pytest.raises(PathRefused, match="the volume itself"):
        storage.delete(volume, "")


def test_ten_thousand_entries_are_listed_sorted_and_paged_fast(volume: str) -> None:
    for index in range(10_000):
        os.close(os.open(os.path.join(volume, f"f{index:05d}"), os.O_CREAT | os.O_WRONLY, 0o644))
    began = time.monotonic()
    entries = storage.list_dir(volume)
    elapsed = time.monotonic() - began
    assert len(entries) == 10_000 and [e.name for e in entries] == sorted(e.name for e in entries)
    assert elapsed < 2.0, f"listing took {elapsed:.2f} s"
    page = storage.list_dir(volume, "", limit=50, offset=9_990)
    assert [entry.name for entry in page] == [f"f{index:05d}" for index in range(9_990, 10_000)]
    assert all(entry.kind == "file" and entry.size == 0 and entry.modified > 0 for entry in page)


def test_list_dir_reports_kinds_sizes_and_refuses_a_file(volume: str) -> None:
    storage.make_dir(volume, "sub")
    upload(volume, "file", b"12345")
    os.symlink("file", os.path.join(volume, "link"))
    found = {entry.name: (entry.kind, entry.size) for entry in storage.list_dir(volume)}
    assert found == {"file": ("file", 5), "link": ("link", 4), "sub": ("dir", 0)}
    with pytest.raises(Conflict):
        storage.list_dir(volume, "file")
    with pytest.raises(NotFound):
        storage.list_dir(volume, "nothing")


def test_usage_counts_regular_files_once_and_follows_no_link(volume: str, outside: Path) -> None:
    (outside / "big").write_bytes(b"b" * 100_000)
    storage.make_dir(volume, "a/b")
    upload(volume, "a/one", b"1" * 1000)
    upload(volume, "a/b/two", b"2" * 234)
    os.link(os.path.join(volume, "a", "one"), os.path.join(volume, "hard"))
    os.symlink(outside, os.path.join(volume, "a", "out"))
    os.symlink(outside / "big", os.path.join(volume, "big"))
    assert storage.usage(volume) == 1234
    assert LocalDirectory().usage(volume) == 1234
    with pytest.raises(NotFound):
        storage.usage(os.path.join(volume, "missing"))


def test_usage_refuses_a_tree_deeper_than_it_walks(volume: str) -> None:
    fd = os.open(volume, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(MAX_DEPTH + 1):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    with pytest.raises(PathRefused) as refused:
        storage.usage(volume)
    assert refused.value.code == "too_deep"


def test_an_upload_abandoned_by_a_killed_console_is_swept_by_the_next_measurement(volume: str) -> None:
    # What a kill -9 in the middle of an upload leaves: its temporary file, no longer written to.
    abandoned = Path(volume, f"{storage_paths.UPLOAD_PREFIX}dead")
    abandoned.write_bytes(b"x" * 1000)
    old = time.time() - storage_paths.STALE_UPLOAD_SECONDS - 60
    os.utime(abandoned, (old, old))
    in_progress = Path(volume, f"{storage_paths.UPLOAD_PREFIX}live")
    in_progress.write_bytes(b"y" * 10)
    Path(volume, "kept.txt").write_bytes(b"z" * 5)
    assert storage.usage(volume) == 15
    assert not abandoned.exists() and in_progress.exists()
