"""Storage drivers: the volume directories below a storage root that workloads mount.

A storage root is a host directory that holds volumes, one directory each
(the mount's `source`, strictly below the root). Two drivers:

- `LocalDirectory`: a directory on this node's own disk (a single-node
  installation); the root is created when missing.
- `SharedFilesystem`: a filesystem mounted at the same path on every host
  (NFS, CephFS, sshfs, ...). Its root must hold the file
  `.gpucloud-storage` with the mount's `marker`: a share that is not
  mounted leaves an empty directory, and volumes made there would silently
  live on the local disk, seen by no other host.

`storage_for` picks the driver of a mount (a marker means shared),
and `prepare_mounts` readies every mount of a spec before a runtime starts
it (the console prepares a volume where it reaches the storage the same
way; `prepare` does not look at the mount's target).

`prepare` walks from the root to the volume one component at a time with
O_NOFOLLOW, creating what is missing (the volume itself with its owner and
mode, the directories on the way 0711 and the caller's): a symlink below
the root is refused, never followed, so a volume cannot lead out of its
root. Volumes must not nest (the policy refuses nested sources in one
spec), or a workload could plant a symlink where another volume is bound.

The file operations (`list_dir`, `open_read`, `file_size`, `write_file`,
`make_dir`, `delete`, `usage`) are those of `_files`, confined to
one volume directory; they are the same for both drivers, so they are
offered here as functions too, with the typed errors of `_paths`.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import stat
import threading
from collections.abc import Iterable
from typing import BinaryIO, Protocol, runtime_checkable

from inventory.drivers.base import Mount, PermanentDriverError, RunAs, TransientDriverError
from inventory.drivers.storage._files import (
    FileEntry,
    delete,
    list_dir,
    make_dir,
    open_read,
    write_file,
)
from inventory.drivers.storage._paths import (
    PathRefused,
    open_child_dir,
    open_volume,
    split_relative,
    usage,
)

MARKER_FILE = ".gpucloud-storage"
VOLUME_MODE = 0o770
MARKER_TIMEOUT = 10.0
"""Seconds a marker read may take: a hung network filesystem must not hang the agent's start."""
_PARENT_MODE = 0o711
_MAX_MARKER_BYTES = 4096


class StorageNotMounted(PermanentDriverError):
    """A shared filesystem's root lacks its marker (not mounted here) or holds another storage's."""

    code = "storage_not_mounted"


@runtime_checkable
class Storage(Protocol):
    """A place volumes live: ready one for a workload, measure it, and browse it safely."""

    kind: str

    def prepare(self, mount: Mount, run_as: RunAs | None = None, mode: int = VOLUME_MODE) -> str:
        """Make sure `mount.source` exists below `mount.root`; return its real path (what a runtime binds).

        A missing volume directory is created with the mount's `mode`
        (else `mode`), owned by the mount's `uid`:`gid` (else `run_as`'s
        uid and gid; else the caller's); an existing one is left as it is,
        except that a mount naming its own `uid`:`gid` has them (and its
        mode) put back on the volume's directory when this runs as root (a
        console not running as root made it under its own user).
        Raises StorageNotMounted (shared root without its marker),
        PathRefused (a symlink on the way, a source not strictly below the
        root), PermanentDriverError `storage_owner` when the owner cannot
        be set; TransientDriverError `storage_timeout` when the root does
        not answer.
        """
        ...

    def usage(self, path: str) -> int:
        """Return the bytes of the regular files below `path` (no symlink followed, hard links once)."""
        ...

    def list_dir(self, volume_dir: str, rel: str = "", *, limit: int | None = None, offset: int = 0) -> list[FileEntry]:
        """Return directory `rel` of the volume, sorted by name (see `_files.list_dir`)."""
        ...

    def open_read(self, volume_dir: str, rel: str) -> BinaryIO:
        """Return regular file `rel` of the volume opened for binary reading (streamed; the caller closes it)."""
        ...

    def write_file(self, volume_dir: str, rel: str, chunks: Iterable[bytes], max_bytes: int) -> int:
        """Write file `rel` of the volume whole or not at all; return its size (TooLarge over `max_bytes`)."""
        ...

    def make_dir(self, volume_dir: str, rel: str) -> None:
        """Create directory `rel` of the volume and its missing parents (Conflict when it exists)."""
        ...

    def delete(self, volume_dir: str, rel: str) -> int:
        """Delete file, link or directory tree `rel` of the volume (NotFound when absent); return the bytes freed."""
        ...


class _Volumes:
    """What both drivers share: preparing a volume below a checked root, and the confined file operations."""

    kind = "abstract"

    def check_root(self, root: str, marker: str) -> None:
        """Raise unless `root` is a storage root this host may make volumes in."""
        raise NotImplementedError

    def prepare(self, mount: Mount, run_as: RunAs | None = None, mode: int = VOLUME_MODE) -> str:
        """See `Storage.prepare`."""
        stated = (mount.uid, mount.gid) if mount.uid is not None and mount.gid is not None else None
        owner = stated if stated is not None else (run_as.uid, run_as.gid) if run_as is not None else None
        self.check_root(mount.root, mount.marker)
        chosen = mount.mode if mount.mode is not None else mode
        volume = _make_volume(mount.root, mount.source, owner, chosen, repair=stated is not None and os.geteuid() == 0)
        for subdir in mount.subdirs:
            _make_subdir(volume, subdir, owner, chosen)
        return volume

    def usage(self, path: str) -> int:
        """See `Storage.usage`."""
        return usage(path)

    def list_dir(self, volume_dir: str, rel: str = "", *, limit: int | None = None, offset: int = 0) -> list[FileEntry]:
        """See `Storage.list_dir`."""
        return list_dir(volume_dir, rel, limit=limit, offset=offset)

    def open_read(self, volume_dir: str, rel: str) -> BinaryIO:
        """See `Storage.open_read`."""
        return open_read(volume_dir, rel)

    def write_file(self, volume_dir: str, rel: str, chunks: Iterable[bytes], max_bytes: int) -> int:
        """See `Storage.write_file`."""
        return write_file(volume_dir, rel, chunks, max_bytes)

    def make_dir(self, volume_dir: str, rel: str) -> None:
        """See `Storage.make_dir`."""
        make_dir(volume_dir, rel)

    def delete(self, volume_dir: str, rel: str) -> int:
        """See `Storage.delete`."""
        return delete(volume_dir, rel)


class LocalDirectory(_Volumes):
    """Volumes in a directory of this node's disk; the root is created when missing, no marker needed."""

    kind = "local"

    def check_root(self, root: str, marker: str) -> None:
        """Create `root` when missing; a marker is not looked for (nothing else could be mounted there)."""
        os.makedirs(root, mode=_PARENT_MODE, exist_ok=True)


class SharedFilesystem(_Volumes):
    """Volumes on a filesystem mounted at the same path on every host; its root must hold the marker."""

    kind = "shared"

    def __init__(self, *, marker_timeout: float = MARKER_TIMEOUT) -> None:
        self.marker_timeout = marker_timeout

    def check_root(self, root: str, marker: str) -> None:
        """Raise StorageNotMounted unless `root`'s marker file exists and holds `marker` (any, when "")."""
        path = os.path.join(root, MARKER_FILE)
        found = _read_marker(path, self.marker_timeout)
        if found is None:
            raise StorageNotMounted(f"storage {root} is not mounted on this host: no marker at {path}")
        if marker and found.strip() != marker.strip():
            raise StorageNotMounted(f"storage {root} is not the one expected on this host: {path} holds another marker")


def storage_for(mount: Mount) -> Storage:
    """Return the driver of `mount`: SharedFilesystem when it names a marker, else LocalDirectory."""
    return SharedFilesystem() if mount.marker else LocalDirectory()


def prepare_mounts(mounts: Iterable[Mount], run_as: RunAs | None) -> tuple[Mount, ...]:
    """Prepare every mount (see `Storage.prepare`); return them with `source` set to the real volume path."""
    return tuple(dataclasses.replace(mount, source=storage_for(mount).prepare(mount, run_as)) for mount in mounts)


# --- helpers ------------------------------------------------------------------------


def _make_volume(root: str, source: str, owner: tuple[int, int] | None, mode: int, *, repair: bool = False) -> str:
    """Walk from `root` to `source` without following symlinks, making what is missing; return the real path.

    `repair`: an existing volume directory gets `owner` and `mode` back when it has others.
    """
    parts = _below_root(root, source)
    fd = open_volume(root)
    try:
        for depth, part in enumerate(parts, start=1):
            last = depth == len(parts)
            child, made = _made_dir(fd, part, "/".join(parts[:depth]))
            os.close(fd)
            fd = child
            if made or (last and repair and _differs(fd, owner, mode)):
                _settle(fd, owner if last else None, mode if last else _PARENT_MODE, source)
    finally:
        os.close(fd)
    volume = os.path.join(os.path.realpath(root), *parts)
    if os.path.realpath(source) != volume:  # swapped for a symlink since the walk
        raise PathRefused(f"volume {source} leads out of its storage root {root}")
    return volume


def _make_subdir(volume: str, rel: str, owner: tuple[int, int] | None, mode: int) -> None:
    """Make the missing components of `rel` below `volume` with `owner` and `mode`; never follows a symlink."""
    fd = open_volume(volume)
    try:
        parts = split_relative(rel)
        for depth, part in enumerate(parts, start=1):
            child, made = _made_dir(fd, part, "/".join(parts[:depth]))
            os.close(fd)
            fd = child
            if made:
                _settle(fd, owner, mode, os.path.join(volume, *parts[:depth]))
    finally:
        os.close(fd)


def _below_root(root: str, source: str) -> list[str]:
    """Return the components of `source` below `root`; PathRefused unless it is strictly below it."""
    if not os.path.isabs(root) or not os.path.isabs(source):
        raise PathRefused(f"volume {source!r} and its root {root!r} must be absolute paths")
    relative = os.path.relpath(os.path.normpath(source), os.path.normpath(root))
    parts = None if relative == ".." or relative.startswith("../") else split_relative(relative)
    if not parts:
        raise PathRefused(f"volume {source} is not below its storage root {root}")
    return parts


def _made_dir(parent: int, name: str, shown: str) -> tuple[int, bool]:
    """Return a descriptor of directory `name` in `parent` (never a symlink), and whether it was made now."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent)  # nobody else gets in before it has its owner and mode
    except FileExistsError:
        return open_child_dir(parent, name, shown), False
    return open_child_dir(parent, name, shown), True


def _differs(fd: int, owner: tuple[int, int] | None, mode: int) -> bool:
    found = os.fstat(fd)
    return (owner is not None and (found.st_uid, found.st_gid) != owner) or stat.S_IMODE(found.st_mode) != mode


def _settle(fd: int, owner: tuple[int, int] | None, mode: int, shown: str) -> None:
    """Give a directory just made its owner (when one is asked for), then its mode (a chown may clear setgid)."""
    if owner is not None:
        try:
            os.fchown(fd, *owner)
        except PermissionError as error:
            raise PermanentDriverError(
                f"cannot give volume {shown} to {owner[0]}:{owner[1]} (not running as root)", code="storage_owner"
            ) from error
    os.fchmod(fd, mode)


def _read_marker(path: str, timeout: float) -> str | None:
    """Return the marker file's text, None when there is none; TransientDriverError when it does not answer.

    The read runs in a daemon thread: a hung network mount keeps that
    thread, not the caller.
    """
    answer: queue.Queue[str | None | OSError] = queue.Queue(maxsize=1)

    def read() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as marker:
                answer.put(marker.read(_MAX_MARKER_BYTES).decode("utf-8", "replace"))
        except (FileNotFoundError, NotADirectoryError):
            answer.put(None)
        except OSError as error:
            answer.put(error)

    threading.Thread(target=read, name="storage-marker", daemon=True).start()
    try:
        found = answer.get(timeout=timeout)
    except queue.Empty:
        raise TransientDriverError(f"{path} did not answer within {timeout:g} s", code="storage_timeout") from None
    if isinstance(found, OSError):
        raise StorageNotMounted(f"cannot read the storage marker {path}: {found}")
    return found
