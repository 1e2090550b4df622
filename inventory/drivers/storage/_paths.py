"""Confined paths inside one volume directory: how every storage operation reaches a file without leaving it.

A path is relative to a volume directory the caller names (a host path it
trusts: the mount's `source`). It is walked one component at a time from an
open descriptor of that directory (`openat` with O_NOFOLLOW and
O_DIRECTORY), so a symlink, even one a workload plants or swaps in while
the walk runs, is refused and never followed. Absolute paths, `..` and NUL
are refused before any file is touched.

Errors are PermanentDriverErrors with a stable `code`: `PathRefused`
(`path_refused`; `permission_denied`; `too_deep`), `NotFound`
(`not_found`), `TooLarge` (`too_large`, or `no_space` when the filesystem
is full) and `Conflict` (`conflict`: the path exists, or is not of the kind
asked). `usage` measures a tree the same way. Used by `_files` and
`storage`.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from inventory.drivers.base import PermanentDriverError

MAX_DEPTH = 512
# An upload is written under this name and renamed when whole (`_files.write_file`). One left behind by
# a console killed mid-upload has stopped changing: `usage` removes it once it is older than a day.
UPLOAD_PREFIX = ".gpucloud-upload-"
STALE_UPLOAD_SECONDS = 24 * 3600
"""How deep `usage` walks; deeper trees are refused (each level holds a descriptor open)."""
MAX_NAME_BYTES = 255

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PathRefused(PermanentDriverError):
    """The path is not allowed: absolute, `..`, NUL, a symlink on the way, or not permitted."""

    code = "path_refused"


class NotFound(PermanentDriverError):
    """Nothing exists at the path (or the volume directory itself is missing)."""

    code = "not_found"


class TooLarge(PermanentDriverError):
    """An upload is over its limit, or the filesystem has no room for it; nothing was written."""

    code = "too_large"


class Conflict(PermanentDriverError):
    """The path exists already, or is not of the kind the call needs (a directory where a file is meant)."""

    code = "conflict"


# --- paths ------------------------------------------------------------------------


def split_relative(rel: str) -> list[str]:
    """Return the components of the relative path `rel` ("" and "." give []); raises PathRefused.

    Refused: anything but a string, NUL, an absolute path, `..`, a
    component over MAX_NAME_BYTES bytes. Empty and `.` components are
    dropped (`a//b/./c/` is `a/b/c`).
    """
    if not isinstance(rel, str) or "\0" in rel:
        raise PathRefused(f"path {rel!r} is not a string without NUL")
    if rel.startswith("/"):
        raise PathRefused(f"path {rel!r} is absolute; paths are relative to the volume")
    parts = [part for part in rel.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise PathRefused(f"path {rel!r} climbs out with '..'")
    if any(len(os.fsencode(part)) > MAX_NAME_BYTES for part in parts):
        raise PathRefused(f"path {rel!r} has a name over {MAX_NAME_BYTES} bytes")
    return parts


def leaf(rel: str) -> tuple[list[str], str]:
    """Return the directory components and the last name of `rel`, which must name something below the volume."""
    parts = split_relative(rel)
    if not parts:
        raise PathRefused("the path names the volume itself")
    return parts[:-1], parts[-1]


def refusal(error: OSError, shown: str) -> PermanentDriverError:
    """Return the driver error an OSError on `shown` stands for (one that is none of these is re-raised)."""
    if isinstance(error, FileNotFoundError):
        return NotFound(f"{shown} does not exist")
    if isinstance(error, PermissionError):
        return PathRefused(f"{shown}: permission denied", code="permission_denied")
    if error.errno == errno.ELOOP:
        return PathRefused(f"{shown} is a symbolic link; links are never followed")
    if error.errno in (errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY):
        return Conflict(f"{shown}: {os.strerror(error.errno)}")
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return TooLarge(f"{shown}: {os.strerror(error.errno)}", code="no_space")
    raise error


def open_volume(volume_dir: str) -> int:
    """Return a descriptor of the volume directory (trusted: it may itself sit below a symlinked root)."""
    try:
        return os.open(volume_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise refusal(error, f"volume directory {volume_dir}") from error


def open_child_dir(parent: int, name: str, shown: str) -> int:
    """Return a descriptor of directory `name` in `parent`; refuses a symlink (PathRefused), never follows it."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno == errno.ENOTDIR and _is_link(parent, name):
            raise PathRefused(f"{shown} is a symbolic link; links are never followed") from error
        raise refusal(error, shown) from error


def _is_link(parent: int, name: str) -> bool:
    with suppress(OSError):
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    return False


@contextmanager
def opened_dir(volume_dir: str, parts: list[str]) -> Iterator[int]:
    """Yield a descriptor of the directory `parts` below `volume_dir`, reached without following any symlink."""
    fd = open_volume(volume_dir)
    try:
        for depth, part in enumerate(parts, start=1):
            child = open_child_dir(fd, part, "/".join(parts[:depth]))
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def volume_owner(volume_dir: str) -> tuple[int, int] | None:
    """Return the volume directory's uid and gid when this process may give files away (root), else None."""
    if os.geteuid() != 0:
        return None
    found = os.stat(volume_dir)
    return found.st_uid, found.st_gid


# --- usage --------------------------------------------------------------------------


def usage(path: str) -> int:
    """Return the bytes the regular files below directory `path` hold (apparent size, hard links once).

    Symlinks are not followed and count nothing. Entries that vanish during
    the walk are skipped. An abandoned upload (`UPLOAD_PREFIX`, unchanged
    for STALE_UPLOAD_SECONDS) is removed and counts nothing. Raises NotFound when `path` is missing,
    PathRefused (`too_deep`) for a tree deeper than MAX_DEPTH.
    """
    return tree_usage(open_volume(path), path)


def tree_usage(root: int, shown: str) -> int:
    """Return the bytes of the regular files below the directory `root` (a descriptor it closes)."""
    seen: set[tuple[int, int]] = set()
    try:
        total, below = _scan(root, seen)
    except BaseException:
        os.close(root)
        raise
    stack = [(root, iter(below))]
    try:
        while stack:
            fd, pending = stack[-1]
            name = next(pending, None)
            if name is None:
                os.close(stack.pop()[0])
                continue
            if len(stack) >= MAX_DEPTH:
                raise PathRefused(f"{shown} is more than {MAX_DEPTH} directories deep", code="too_deep")
            child = _open_below(fd, name)
            if child is not None:
                stack.append((child, iter(())))  # closed by the `finally` below if the scan fails
                size, deeper = _scan(child, seen)
                total += size
                stack[-1] = (child, iter(deeper))
    finally:
        for fd, _ in stack:
            os.close(fd)
    return total


def _open_below(parent: int, name: str) -> int | None:
    """Return a descriptor of subdirectory `name`, or None when it is gone or has become something else."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise refusal(error, name) from error


def _scan(fd: int, seen: set[tuple[int, int]]) -> tuple[int, list[str]]:
    """Return the bytes of the regular files in directory `fd` and the names of its subdirectories."""
    size, subdirectories = 0, []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirectories.append(entry.name)
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            try:
                found = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if entry.name.startswith(UPLOAD_PREFIX) and time.time() - found.st_mtime > STALE_UPLOAD_SECONDS:
                with suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=fd)
                continue
            if found.st_nlink > 1:
                if (found.st_dev, found.st_ino) in seen:
                    continue
                seen.add((found.st_dev, found.st_ino))
            size += found.st_size
    return size, subdirectories


CHECKPOINT_MAX_ENTRIES = 10_000
"""Entries `newest_file_time` looks at, at most: a checkpoint directory with millions of files costs no more."""


def newest_file_time(directory: str, *, max_entries: int = CHECKPOINT_MAX_ENTRIES) -> float | None:
    """Return the newest modification time (epoch seconds) of a regular file below `directory`, or None.

    Symlinks are not followed; at most `max_entries` entries are looked at.
    """
    newest: float | None = None
    stack, seen = [directory], 0
    while stack and seen < max_entries:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                seen += 1
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                    newest = mtime if newest is None else max(newest, mtime)
                if seen >= max_entries:
                    break
    return newest
