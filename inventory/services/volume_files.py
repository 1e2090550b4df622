"""The file browser's writes and reads on a volume: list, download, upload, make a folder, delete.

Every call checks the actor's rights (`volume_access.volume_rights`) first
and works on the volume's directory as the console reaches it, through the
storage driver (`inventory.drivers.storage`), which confines every path to
that directory (no `..`, no absolute path, no symlink followed). The console
reaches a backend only where the backend's marker proves it is mounted (the
driver checks it), so a share that is not mounted is refused, not written
underneath. An upload is written to a temporary file and renamed only when
complete and within quota, so a refused upload writes nothing.

Driver errors become the project's: a refused path is a ValidationError
naming `path`, an upload over its room `FileTooLarge` (naming `file` and the
rule), a missing file `FileNotFound` (404), a path of the wrong kind a
Conflict, a backend the console cannot reach `StorageUnavailable`.

Quotas: an upload may use what is left of the volume's own limit, its
home limit (homes), its project's limit (project volumes and datasets) and
its tenant's limit, whichever is least, and never more than
VOLUME_UPLOAD_MAX_BYTES; overwriting a file frees its old size first. Use
is kept in `Volume.used_bytes`, measured in full by `measure_usage` and
moved by each write here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.http import Http404
from django.utils import timezone

from common.errors import Conflict, invalid
from inventory.choices import VolumeKind
from inventory.drivers import storage
from inventory.drivers.base import DriverError, Mount, RunAs
from inventory.drivers.storage import split_relative
from inventory.models import Volume
from inventory.selectors import storage_use
from inventory.services.volume_access import directory_owner, host_path, volume_rights
from tenants.context import Actor
from tenants.scoping import tenant_scope
from tenants.services import record_audit_event

log = logging.getLogger(__name__)

FileEntry = storage.FileEntry


class FileTooLarge(ValidationError):
    """An upload over the room its quotas leave; names the field `file` and the rule (its `code`)."""

    def __init__(self, message: str, *, rule: str) -> None:
        super().__init__({"file": [ValidationError(message, code=rule)]})
        self.rule = rule
        self.text = message


class FileNotFound(Http404):
    """Nothing is at the path asked for in the volume."""


class StorageUnavailable(Exception):
    """The console cannot reach the volume's storage right now (not mounted here, not answering)."""


@dataclass(frozen=True)
class Room:
    """How many bytes one upload may write now, and the rule that allows no more."""

    left: int
    rule: str
    label: str


# --- where the volume is ------------------------------------------------------------


def _directory(volume: Volume) -> str:
    return host_path(volume.backend, volume, console=True)


def _mount(volume: Volume) -> Mount:
    # Always with the marker: the console reaches a backend only where the marker proves the tree is there
    # (a root it made itself holds one; a node-local one it cannot see would otherwise be made on its own disk).
    backend = volume.backend
    return Mount(source=_directory(volume), target="/", root=backend.console_root, marker=backend.marker)


def _driver(volume: Volume) -> storage.Storage:
    return storage.storage_for(_mount(volume))


@contextmanager
def _translated(volume: Volume) -> Iterator[None]:
    """Turn the storage driver's errors into the project's (see the module's docstring)."""
    try:
        yield
    except storage.PathRefused as error:
        raise invalid("path", error.code, str(error)) from error
    except storage.NotFound as error:
        raise FileNotFound(str(error)) from error
    except storage.TooLarge as error:
        raise FileTooLarge(str(error), rule=error.code) from error
    except storage.Conflict as error:
        raise Conflict(str(error), code="path_conflict") from error
    except (DriverError, OSError) as error:
        log.warning("storage of volume %s unreachable: %s", volume.pk, error)
        raise StorageUnavailable(
            f"The storage of {volume.name} cannot be reached from the console right now; try again later."
        ) from error


def _rights(actor: Actor, volume: Volume, *, write: bool) -> None:
    rights = volume_rights(actor, volume)
    if not rights.read:
        raise PermissionDenied(f"The files of {volume.name} are its owner's alone.")
    if write and not rights.write:
        raise PermissionDenied(f"You may not change the files of {volume.kind} {volume.name}.")


def ensure_directory(volume: Volume) -> str:
    """Create the volume's directory where the console reaches it (with its owner and mode); return its path.

    Raises StorageUnavailable when the backend's marker is not there.
    """
    uid, gid, mode = directory_owner(volume)
    # Only root may give a directory away: a console running as itself keeps what it makes, and an agent
    # running as root gives the volume's directory its owner back when a workload first mounts it.
    run_as = RunAs(uid, gid) if os.geteuid() == 0 else None
    with _translated(volume):
        return _driver(volume).prepare(_mount(volume), run_as, mode)


def has_files(volume: Volume) -> bool:
    """Return whether the volume's directory holds anything; raises StorageUnavailable when it cannot tell."""
    directory = ensure_directory(volume)
    with _translated(volume):
        return bool(storage.list_dir(directory, "", limit=1))


# --- reading -----------------------------------------------------------------------


def list_files(
    *, actor: Actor, volume: Volume, path: str = "", limit: int | None = None, offset: int = 0
) -> list[FileEntry]:
    """Return the entries of folder `path` of the volume, sorted by name, `offset` skipped, at most `limit`.

    Only the page returned is stat'ed, so a folder of many thousand files
    costs one read of its names. Raises PermissionDenied, ValidationError
    (`path`), FileNotFound, Conflict (not a folder), StorageUnavailable.
    """
    _rights(actor, volume, write=False)
    directory = ensure_directory(volume)
    try:
        with _translated(volume):
            return storage.list_dir(directory, path, limit=limit, offset=offset)
    except Conflict as error:
        raise invalid("path", "not_a_folder", f"{path} is not a folder.") from error


def open_file(*, actor: Actor, volume: Volume, path: str) -> tuple[BinaryIO, int]:
    """Return regular file `path` of the volume opened for binary reading and its size (the caller closes it).

    Raises PermissionDenied, ValidationError (`path`, also when it is not a
    regular file), FileNotFound, StorageUnavailable.
    """
    _rights(actor, volume, write=False)
    split_path(path, leaf=True)
    directory = ensure_directory(volume)
    try:
        with _translated(volume):
            opened = storage.open_read(directory, path)
    except Conflict as error:
        raise invalid("path", "not_a_file", f"{path} is not a file.") from error
    return opened, os.fstat(opened.fileno()).st_size


# --- quotas ------------------------------------------------------------------------


def room(volume: Volume, *, replacing: int = 0) -> Room:
    """Return the room one upload into `volume` has now and the rule that bounds it (the tightest limit).

    `replacing` is the size of the file the upload overwrites: it is freed
    first for every quota (not for the upload cap, which bounds one file).
    """
    tenant = volume.tenant
    cap = int(settings.VOLUME_UPLOAD_MAX_BYTES)
    limits = [Room(cap, "upload_limit", f"the console's upload limit of {cap} bytes")]
    if volume.size_limit_bytes is not None:
        left = volume.size_limit_bytes - volume.used_bytes + replacing
        limits.append(Room(left, "volume_limit", f"the volume's size limit of {volume.size_limit_bytes} bytes"))
    if volume.kind == VolumeKind.HOME and tenant.home_limit_bytes is not None:
        left = tenant.home_limit_bytes - volume.used_bytes + replacing
        limits.append(Room(left, "home_limit", f"the tenant's home limit of {tenant.home_limit_bytes} bytes"))
    project = volume.project
    project_limit = project.storage_limit_bytes if project is not None else None
    use = storage_use(tenant.pk) if project_limit is not None or tenant.storage_limit_bytes is not None else None
    if project is not None and project_limit is not None and use is not None:
        left = project_limit - use.of_project(project.pk) + replacing
        label = f"project {project.slug}'s storage quota of {project_limit} bytes"
        limits.append(Room(left, "project_quota", label))
    if tenant.storage_limit_bytes is not None and use is not None:
        label = f"the tenant's storage quota of {tenant.storage_limit_bytes} bytes"
        limits.append(Room(tenant.storage_limit_bytes - use.total + replacing, "tenant_quota", label))
    tightest = min(limits, key=lambda limit: limit.left)
    return Room(max(0, tightest.left), tightest.rule, tightest.label)


def room_for(volume: Volume, *, replacing: int = 0) -> int:
    """Return how many bytes one upload into `volume` may write now (all its quotas, and the upload cap)."""
    return room(volume, replacing=replacing).left


def room_at(volume: Volume, path: str) -> Room:
    """Return the room an upload to file `path` of the volume has now (the file there now is freed first).

    Raises ValidationError naming `path` for a path outside the volume, FileNotFound, StorageUnavailable.
    """
    split_path(path, leaf=True)
    directory = ensure_directory(volume)
    with _translated(volume):
        return room(volume, replacing=storage.file_size(directory, path))


def too_large(path: str, size: int | None, allowed: Room) -> FileTooLarge:
    """Return the refusal of an upload to `path` (of `size` bytes, when known) over the room `allowed`."""
    what = f"{path} ({size} bytes)" if size is not None else path
    message = f"{what} does not fit: {allowed.label} leaves room for {allowed.left} bytes. Nothing was written."
    return FileTooLarge(message, rule=allowed.rule)


# --- writing -----------------------------------------------------------------------


def upload_file(*, actor: Actor, volume: Volume, path: str, chunks: Iterable[bytes], size: int | None = None) -> int:
    """Write `chunks` to file `path` of the volume (replacing it), atomically and within quota; return its size.

    `size`, when the caller knows it (a Content-Length), is checked against
    the room first, before any byte is read. Raises FileTooLarge (nothing
    written) past the room `room` gives, ValidationError for a path outside
    the volume, FileNotFound when its folder does not exist, Conflict when
    a folder is there, PermissionDenied, StorageUnavailable.
    """
    _rights(actor, volume, write=True)
    split_path(path, leaf=True)
    directory = ensure_directory(volume)
    with _translated(volume):
        old = storage.file_size(directory, path)
    allowed = room(volume, replacing=old)
    if size is not None and size > allowed.left:
        raise too_large(path, size, allowed)
    try:
        with _translated(volume):
            written = storage.write_file(directory, path, chunks, allowed.left)
    except FileTooLarge as error:
        if error.rule != "too_large":  # the filesystem itself is full
            raise
        raise too_large(path, size, allowed) from error
    _moved(volume, written - old)
    _audit(actor, volume, "volume.file_upload", path, size=written)
    return written


def split_path(path: str, *, leaf: bool = False) -> list[str]:
    """Return the components of `path` in a volume; raises ValidationError naming `path` when it is refused.

    With `leaf` the path must name something below the volume (not the volume itself).
    """
    try:
        parts = split_relative(path)
    except storage.PathRefused as error:
        raise invalid("path", error.code, str(error)) from error
    if leaf and not parts:
        raise invalid("path", "path_refused", "Name a file or folder inside the volume.")
    return parts


def make_folder(*, actor: Actor, volume: Volume, path: str) -> None:
    """Create folder `path` and the folders above it that are missing.

    Raises ValidationError (`path`), Conflict when `path` exists already or
    a file is in the way, PermissionDenied, StorageUnavailable.
    """
    _rights(actor, volume, write=True)
    split_path(path, leaf=True)
    directory = ensure_directory(volume)
    with _translated(volume):
        storage.make_dir(directory, path)
    _audit(actor, volume, "volume.folder_create", path, size=0)


def delete_path(*, actor: Actor, volume: Volume, path: str) -> int:
    """Delete file or folder `path` of the volume (a folder with everything in it); return the bytes freed.

    A symlink is deleted, never followed. Raises ValidationError (`path`,
    also for the volume itself), FileNotFound, PermissionDenied, StorageUnavailable.
    """
    _rights(actor, volume, write=True)
    split_path(path, leaf=True)
    directory = ensure_directory(volume)
    with _translated(volume):
        freed = storage.delete(directory, path)
    _moved(volume, -freed)
    _audit(actor, volume, "volume.file_delete", path, size=freed)
    return freed


def _moved(volume: Volume, delta: int) -> None:
    if delta:
        # Never below 0 (the column refuses it): a measurement that raced us is corrected at the next one.
        with tenant_scope(volume.tenant):
            Volume.objects.filter(pk=volume.pk).update(used_bytes=Greatest(F("used_bytes") + delta, Value(0)))
        volume.refresh_from_db(fields=["used_bytes"])


def _audit(actor: Actor, volume: Volume, action: str, path: str, *, size: int) -> None:
    record_audit_event(
        actor=actor, action=action, obj=volume, tenant_id=volume.tenant_id, after={"path": path, "bytes": size}
    )


def measure_usage(*, volumes: Iterable[Volume] | None = None) -> int:
    """Measure the bytes every volume (or those given) holds where the console reaches it; return how many it measured.

    A volume whose directory the console cannot reach (a node-local backend
    on another host) keeps its last figure.
    """
    rows = volumes if volumes is not None else Volume.all_tenants.select_related("backend")
    measured = 0
    for volume in rows:
        try:
            used = storage.usage(_directory(volume))
        except (DriverError, OSError):
            continue
        Volume.all_tenants.filter(pk=volume.pk).update(used_bytes=used, used_measured_at=timezone.now())
        measured += 1
    return measured
