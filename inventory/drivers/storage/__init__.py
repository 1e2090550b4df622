"""Storage drivers: the volume directories below a storage root that workloads mount (see `_volumes`).

Public: the drivers (`LocalDirectory`, `SharedFilesystem`, picked by
`storage_for`), `prepare_mounts` for the runtimes, the file operations
confined to one volume directory and their typed errors, and
`split_relative`, how a relative path is read. The `_`-modules are this
package's own: an import-linter contract (pyproject.toml) keeps every
other module out of them.
"""

from __future__ import annotations

from inventory.drivers.storage._files import (
    FileEntry,
    FileKind,
    delete,
    file_size,
    list_dir,
    make_dir,
    open_read,
    write_file,
)
from inventory.drivers.storage._paths import (
    Conflict,
    NotFound,
    PathRefused,
    TooLarge,
    newest_file_time,
    split_relative,
    usage,
)
from inventory.drivers.storage._volumes import (
    MARKER_FILE,
    VOLUME_MODE,
    LocalDirectory,
    SharedFilesystem,
    Storage,
    StorageNotMounted,
    prepare_mounts,
    storage_for,
)

__all__ = [
    "MARKER_FILE",
    "VOLUME_MODE",
    "Conflict",
    "FileEntry",
    "FileKind",
    "LocalDirectory",
    "NotFound",
    "PathRefused",
    "SharedFilesystem",
    "Storage",
    "StorageNotMounted",
    "TooLarge",
    "delete",
    "file_size",
    "list_dir",
    "make_dir",
    "newest_file_time",
    "open_read",
    "prepare_mounts",
    "split_relative",
    "storage_for",
    "usage",
    "write_file",
]
