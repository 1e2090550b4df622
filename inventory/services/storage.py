"""Storage backends: the default one a fresh console gets, and the ones operators add.

A backend's root carries a marker file (`.gpucloud-storage`) whose content
is the backend's random `marker`: the agent checks it before it mounts a
volume, so a shared filesystem that is not mounted on a host (an empty
directory in its place) is refused instead of silently written to the
host's own disk.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from common.errors import Conflict
from inventory.choices import StorageKind
from inventory.models import Node, NodePool, StorageBackend, Volume
from tenants.context import Actor
from tenants.services import delete_audited, record_audit_event, snapshot
from tenants.services.access import require_operator
from tenants.services.validation import clean_fields

MARKER_FILE = ".gpucloud-storage"
BACKEND_FIELDS = ["name", "kind", "path", "console_path", "node", "is_default"]
DEFAULT_BACKEND_NAME = "default"


def write_marker(root: str, marker: str) -> str:
    """Create `root` and its marker file unless it holds one already; return the marker the root holds now.

    A root that already holds a marker keeps it (a backend registered again
    after its rows were lost): the caller adopts it. Two backends never
    share a tree: `claim_root` refuses a marker another backend holds.
    """
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True, mode=0o711)
    marker_path = path / MARKER_FILE
    try:
        return marker_path.read_text().strip() or marker
    except FileNotFoundError:
        tmp = path / f".{MARKER_FILE}.{secrets.token_hex(4)}"
        tmp.write_text(marker + "\n")
        os.replace(tmp, marker_path)
        return marker


def claim_root(backend: StorageBackend) -> None:
    """Write `backend`'s marker at its root where the console reaches it, adopting one found there; save it.

    Raises Conflict when the root is another backend's.
    """
    found = write_marker(backend.console_root, backend.marker)
    if found == backend.marker:
        return
    if StorageBackend.objects.filter(marker=found).exclude(pk=backend.pk).exists():
        raise Conflict(f"{backend.console_root} is the root of another storage backend.", code="storage_root_taken")
    backend.marker = found
    if backend.pk is not None:
        StorageBackend.objects.filter(pk=backend.pk).update(marker=found)


def default_backend() -> StorageBackend:
    """Return the default backend, creating it on first use at `STORAGE_ROOT` (a shared root every node mounts).

    On one machine every node is this machine, so the root is shared by
    construction; a fleet mounts a shared filesystem there on every host,
    or an operator makes another backend the default.
    """
    backend = StorageBackend.objects.filter(is_default=True).first()
    if backend is not None:
        return backend
    root = str(settings.STORAGE_ROOT)
    try:
        with transaction.atomic():
            backend, _ = StorageBackend.objects.get_or_create(
                name=DEFAULT_BACKEND_NAME,
                defaults={
                    "kind": StorageKind.SHARED,
                    "path": root,
                    "marker": secrets.token_hex(16),
                    "is_default": True,
                },
            )
    except IntegrityError:  # another process created it first
        backend = StorageBackend.objects.get(is_default=True)
    claim_root(backend)
    return backend


@transaction.atomic
def create_storage_backend(
    *,
    actor: Actor,
    name: str,
    kind: str,
    path: str,
    console_path: str = "",
    node: Node | None = None,
    pools: list[NodePool] | None = None,
    is_default: bool = False,
) -> StorageBackend:
    """Register a backend (operators only), write its root's marker where the console reaches it; return it.

    Raises ValidationError naming every failing field (a relative path, a
    local backend without its node, a shared one with a node, a taken name).
    """
    require_operator(actor)
    backend = StorageBackend(
        name=name,
        kind=kind,
        path=path,
        console_path=console_path,
        node=node,
        marker=secrets.token_hex(16),
        is_default=is_default,
    )
    errors: dict[str, list[str]] = {}
    for field, value in (("path", path), ("console_path", console_path)):
        if value and not os.path.isabs(value):
            errors.setdefault(field, []).append("Give an absolute path.")
    if kind == StorageKind.LOCAL and node is None:
        errors.setdefault("node", []).append("A node-local backend names the node its directory is on.")
    if kind == StorageKind.SHARED and node is not None:
        errors.setdefault("node", []).append("A shared backend is on every node of its pools: name pools, not a node.")
    if StorageBackend.objects.filter(name=name).exists():
        errors.setdefault("name", []).append(f"A storage backend named {name} exists already.")
    try:
        clean_fields(backend, exclude=["marker"])
    except ValidationError as error:  # merged with the rules above: every failing field at once
        for field, messages in error.message_dict.items():
            errors.setdefault(field, []).extend(messages)
    if errors:
        raise ValidationError(errors)
    if is_default:
        StorageBackend.objects.filter(is_default=True).update(is_default=False)
    backend.save()
    backend.pools.set(pools or [])
    if kind == StorageKind.SHARED or backend.console_path:
        claim_root(backend)
    record_audit_event(
        actor=actor,
        action="storage_backend.create",
        obj=backend,
        tenant_id=None,
        after=snapshot(backend, BACKEND_FIELDS),
    )
    return backend


@transaction.atomic
def delete_storage_backend(*, actor: Actor, backend: StorageBackend) -> None:
    """Delete a backend that holds no volume (operators only); raises Conflict while volumes live on it."""
    require_operator(actor)
    if Volume.all_tenants.filter(backend=backend).exists():  # every tenant's: `backend.volumes` is scoped to one
        raise Conflict(f"Storage backend {backend.name} still holds volumes.", code="backend_in_use")
    delete_audited(actor=actor, action="storage_backend.delete", obj=backend, tenant_id=None, audited=BACKEND_FIELDS)


class NodeLike(Protocol):
    """What `mountable_backends` reads from a node (a Node row, or the scheduler's lighter stand-in)."""

    @property
    def pk(self) -> int: ...

    @property
    def pool_id(self) -> int: ...


def mountable_backends(
    node: NodeLike, backends: list[StorageBackend], pools_of: Mapping[int, set[int]]
) -> frozenset[str]:
    """Return the names of `backends` that `node` can mount: its own local ones, and shared ones of its pool.

    `pools_of` maps a backend id to the ids of the pools it names (absent or
    empty: every pool).
    """
    names = set()
    for backend in backends:
        if backend.kind == StorageKind.LOCAL:
            if backend.node_id == node.pk:
                names.add(backend.name)
        elif not pools_of.get(backend.pk) or node.pool_id in pools_of[backend.pk]:
            names.add(backend.name)
    return frozenset(names)
