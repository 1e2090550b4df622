"""Confined file operations inside one volume directory: what a file browser may do there, and nothing more.

Every path is reached through `_paths` (no `..`, no absolute path,
no symlink followed, even one swapped in during the walk), so nothing
outside the volume is ever read, written, listed or deleted.

What the console creates (`write_file`, `make_dir`) gets the volume
directory's owner when it runs as root, so the workload can change it;
directories keep the volume's setgid bit, so a project volume's files stay
in the project's group. `storage` offers these through its drivers.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import BinaryIO, Literal

from inventory.drivers.storage._paths import (
    UPLOAD_PREFIX,
    Conflict,
    NotFound,
    PathRefused,
    TooLarge,
    leaf,
    open_child_dir,
    open_volume,
    opened_dir,
    refusal,
    split_relative,
    tree_usage,
    volume_owner,
)

FileKind = Literal["file", "dir", "link"]

FILE_MODE = 0o664
DIR_MODE = 0o775


@dataclass(frozen=True)
class FileEntry:
    """One entry of a directory: `size` in bytes (0 for a directory), `modified` in POSIX seconds."""

    name: str
    kind: FileKind
    size: int
    modified: float


# --- reading ------------------------------------------------------------------------


def _kind(mode: int) -> FileKind:
    if stat.S_ISLNK(mode):
        return "link"
    return "dir" if stat.S_ISDIR(mode) else "file"


def list_dir(volume_dir: str, rel: str = "", *, limit: int | None = None, offset: int = 0) -> list[FileEntry]:
    """Return the entries of directory `rel`, sorted by name, `offset` of them skipped and at most `limit`.

    Symlinks are listed as `link` (never followed); anything that is
    neither a directory nor a link is a `file`. Only the page returned is
    stat'ed, so a large directory costs one read of its names. Raises
    PathRefused, NotFound, Conflict (not a directory).
    """
    if offset < 0 or (limit is not None and limit < 0):
        raise PathRefused("offset and limit must not be negative")
    parts = split_relative(rel)
    with opened_dir(volume_dir, parts) as fd, os.scandir(fd) as entries:
        names = sorted(entry.name for entry in entries)
        page = names[offset:] if limit is None else names[offset : offset + limit]
        return [entry for entry in (_entry(fd, name) for name in page) if entry is not None]


def _entry(parent: int, name: str) -> FileEntry | None:
    try:
        found = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None  # removed since the listing
    kind = _kind(found.st_mode)
    return FileEntry(name=name, kind=kind, size=0 if kind == "dir" else found.st_size, modified=found.st_mtime)


def open_read(volume_dir: str, rel: str) -> BinaryIO:
    """Return the regular file `rel` opened for binary reading; the caller streams and closes it.

    Its size is `os.fstat(file.fileno()).st_size`. Raises PathRefused (a
    symlink anywhere, the path rules), NotFound, Conflict (a directory, a
    FIFO or anything but a regular file).
    """
    fd = _open_file(volume_dir, rel)
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_size(volume_dir: str, rel: str) -> int:
    """Return the size of regular file `rel`, 0 when nothing is there (what an upload there would replace).

    Raises PathRefused (the path rules, a symlink), Conflict (a directory
    or anything but a regular file).
    """
    try:
        fd = _open_file(volume_dir, rel)
    except NotFound:
        return 0
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _open_file(volume_dir: str, rel: str) -> int:
    """Return a read descriptor of regular file `rel`, reached without following any symlink."""
    parts, name = leaf(rel)
    with opened_dir(volume_dir, parts) as parent:
        try:
            # O_NONBLOCK: a FIFO a workload planted must not hang the console in open().
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except OSError as error:
            raise refusal(error, rel) from error
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Conflict(f"{rel} is not a regular file")
    return fd


# --- writing ------------------------------------------------------------------------


def write_file(volume_dir: str, rel: str, chunks: Iterable[bytes], max_bytes: int) -> int:
    """Write `chunks` to file `rel` (replacing a file there) and return the bytes written.

    The bytes go to a temporary file in the same directory, renamed over
    `rel` only once all of them arrived: an upload that is refused, over
    `max_bytes` (TooLarge), or cut short by an exception from `chunks`
    leaves nothing behind, and readers never see half a file. Raises
    PathRefused, NotFound (a missing directory on the way), Conflict (`rel`
    is a directory), TooLarge.
    """
    parts, name = leaf(rel)
    owner = volume_owner(volume_dir)
    with opened_dir(volume_dir, parts) as parent:
        temporary = UPLOAD_PREFIX + secrets.token_hex(8)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(temporary, flags, FILE_MODE, dir_fd=parent)
        except OSError as error:
            raise refusal(error, rel) from error
        try:
            with os.fdopen(fd, "wb") as out:
                written = _copy(chunks, out, max_bytes, rel)
                _settle(out.fileno(), FILE_MODE, owner)
                os.fsync(out.fileno())
            os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException as error:
            with suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=parent)
            if isinstance(error, OSError):
                raise refusal(error, rel) from error
            raise
    return written


def _copy(chunks: Iterable[bytes], out: BinaryIO, max_bytes: int, rel: str) -> int:
    written = 0
    for chunk in chunks:
        written += len(chunk)
        if written > max_bytes:
            raise TooLarge(f"{rel} is over the limit of {max_bytes} bytes; nothing was written")
        out.write(chunk)
    return written


def _settle(fd: int, mode: int, owner: tuple[int, int] | None) -> None:
    """Give what the console made the volume's owner (when root), then `mode` (whatever the umask)."""
    if owner is not None:
        os.fchown(fd, *owner)  # before the chmod: a chown may clear the setgid bit
    os.fchmod(fd, mode)


def make_dir(volume_dir: str, rel: str) -> None:
    """Create directory `rel` and any missing parents; raises Conflict when `rel` exists already.

    Directories made get DIR_MODE, plus the setgid bit when the volume has
    it, and the volume's owner when this process runs as root.
    """
    parents, name = leaf(rel)
    parts = [*parents, name]
    owner = volume_owner(volume_dir)
    fd = open_volume(volume_dir)
    mode = DIR_MODE | (os.fstat(fd).st_mode & stat.S_ISGID)
    try:
        for depth, part in enumerate(parts, start=1):
            shown = "/".join(parts[:depth])
            made = _mkdir(fd, part, shown)
            child = open_child_dir(fd, part, shown)  # refused if a symlink, even one swapped in since the mkdir
            os.close(fd)
            fd = child
            if made:
                _settle(fd, mode, owner)
            elif depth == len(parts):
                raise Conflict(f"{rel} exists already")
    finally:
        os.close(fd)


def _mkdir(parent: int, name: str, shown: str) -> bool:
    """Create directory `name` in `parent`; return False when something is there already."""
    try:
        os.mkdir(name, DIR_MODE, dir_fd=parent)
    except FileExistsError:
        return False
    except OSError as error:
        raise refusal(error, shown) from error
    return True


def delete(volume_dir: str, rel: str) -> int:
    """Delete file, symlink (not its target) or directory tree `rel`; return the bytes it held (as `usage` counts).

    A tree is measured and removed through descriptors (`shutil.rmtree`
    with `dir_fd`), so a directory swapped for a symlink meanwhile is
    refused, not followed. Raises NotFound when nothing is there.
    """
    parts, name = leaf(rel)
    with opened_dir(volume_dir, parts) as parent:
        try:
            found = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISDIR(found.st_mode):
                os.unlink(name, dir_fd=parent)
                return found.st_size if stat.S_ISREG(found.st_mode) else 0
            freed = tree_usage(open_child_dir(parent, name, rel), rel)
            shutil.rmtree(name, dir_fd=parent)
        except OSError as error:
            if error.errno is None:  # rmtree's own refusal: it became a symlink after the stat
                raise PathRefused(f"{rel} changed while it was being deleted") from error
            raise refusal(error, rel) from error
    return freed
