"""Who may do what with a volume, in one place: the API, the pages, the file browser and the mounts use it.

- a home: its owner reads and writes it; nobody else sees its files (tenant
  admins see that it exists and its size, for quotas);
- a project volume: members of its project and of projects it is shared with
  read it, and write it unless the share is read-only; tenant admins too;
- a dataset: members of its project (tenant admins for a tenant-wide one)
  write it through the console; projects it is shared with read it; it is
  mounted read-only into every workload.

Viewers never write. Every other tenant's volume does not exist (404).

Also here, so that everything that names a volume's place agrees: the uid
and gids files in volumes belong to (`uid_of`, `gid_of`, `directory_owner`),
where a workload sees a volume (`mount_target`) and where a host finds it
(`host_path`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Q, QuerySet
from django.http import Http404

from inventory.choices import VolumeKind
from inventory.models import StorageBackend, Volume
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Project, Tenant
from tenants.scoping import tenant_id_scope, tenant_scope
from tenants.services.access import require_role

_SAFE_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,63}")
# Owner-only homes; group-shared project volumes (setgid: new files keep the project's group); datasets
# readable by every group that mounts them.
HOME_MODE, PROJECT_MODE, DATASET_MODE = 0o700, 0o2770, 0o2755


def home_path(user: User) -> str:
    """Return where `user`'s home is mounted: `/home/<username>`, or `/home/user-<id>` for an unusual name."""
    name = user.get_username()
    segment = name if _SAFE_USER.fullmatch(name) and name not in (".", "..") else f"user-{user.pk}"
    return f"/home/{segment}"


def mount_target(volume: Volume) -> str:
    """Return where workloads see `volume`: `/home/<user>`, `/projects/<name>` or `/datasets/<name>`."""
    if volume.kind == VolumeKind.HOME and volume.owner is not None:
        return home_path(volume.owner)
    where = "datasets" if volume.kind == VolumeKind.DATASET else "projects"
    return f"/{where}/{volume.name}"


def host_path(backend: StorageBackend, volume: Volume, *, console: bool = False) -> str:
    """Return the volume's directory as a host that mounts `backend` sees it (or as the console does)."""
    root = backend.console_root if console else backend.path
    return f"{root.rstrip('/')}/{volume.directory}"


def uid_of(user: User) -> int:
    """Return the uid `user`'s workloads run as and their files belong to, on every host."""
    return int(settings.STORAGE_UID_BASE) + int(user.pk)


def gid_of(project_id: int | None) -> int:
    """Return the gid of a project's volumes (the tenant-wide datasets' base gid for None)."""
    return int(settings.STORAGE_GID_BASE) + int(project_id or 0)


def directory_owner(volume: Volume) -> tuple[int, int, int]:
    """Return (uid, gid, mode) the volume's directory is made with."""
    if volume.kind == VolumeKind.HOME and volume.owner is not None:
        uid = uid_of(volume.owner)
        return uid, uid, HOME_MODE
    mode = DATASET_MODE if volume.kind == VolumeKind.DATASET else PROJECT_MODE
    return 0, gid_of(volume.project_id), mode


@dataclass(frozen=True)
class Rights:
    """What one actor may do with one volume's files."""

    read: bool
    write: bool


def _member_projects(actor: Actor, tenant: Tenant) -> set[int]:
    if actor.user is None:
        return set()
    with tenant_scope(tenant):
        return set(Project.objects.filter(memberships__user=actor.user).values_list("pk", flat=True))


def volume_rights(actor: Actor, volume: Volume) -> Rights:
    """Return what `actor` may do with `volume`'s files; raises Http404 when they may not even see it."""
    role = _role_or_404(actor, volume.tenant)
    return _rights(actor, role, _member_projects(actor, volume.tenant), volume)


def rights_by_volume(actor: Actor, tenant: Tenant, volumes: Iterable[Volume]) -> dict[int, Rights]:
    """Return `volume_rights` of each of `volumes` (all of `tenant`) by id (at most two queries for any number).

    A volume `actor` may not see is left out rather than raising.
    """
    role = _role_or_404(actor, tenant)
    projects = _member_projects(actor, tenant)
    rights = {}
    for volume in volumes:
        try:
            rights[volume.pk] = _rights(actor, role, projects, volume)
        except Http404:
            continue
    return rights


def _role_or_404(actor: Actor, tenant: Tenant) -> Role:
    # The role the request in progress resolved already, when there is one (`require_role`); every role sees.
    return require_role(actor, tenant, Role.VIEWER)


def _rights(actor: Actor, role: Role, projects: set[int], volume: Volume) -> Rights:
    writer = role.at_least(Role.MEMBER)
    if volume.kind == VolumeKind.HOME:
        own = actor.user is not None and volume.owner_id == actor.user.pk
        if not own and not role.at_least(Role.ADMIN):
            raise Http404("No such volume.")
        return Rights(read=own, write=own and writer)
    admin = role.at_least(Role.ADMIN)
    # The volume's own tenant scopes its shares, whatever scope the caller is in (prefetched shares cost nothing).
    with tenant_id_scope(volume.tenant_id):
        shares = {share.project_id: share.read_only for share in volume.shares.all()}
    owning = volume.project_id in projects
    shared = projects & set(shares)
    if not (admin or owning or shared):
        raise Http404("No such volume.")
    if volume.kind == VolumeKind.DATASET:
        can_write = admin or owning
    else:
        can_write = admin or owning or any(not shares[p] for p in shared)
    return Rights(read=True, write=writer and can_write)


def visible_volumes(actor: Actor, tenant: Tenant) -> QuerySet[Volume]:
    """Return the volumes of `tenant` that `actor` can see (see `volume_rights`), newest kinds first.

    A request-scoped read: `tenant` must be the active scope (the page's or the API viewset's); under
    another scope it matches nothing.
    """
    role = require_role(actor, tenant, Role.VIEWER)
    volumes = Volume.objects.filter(tenant=tenant).select_related("tenant", "backend", "owner", "project")
    if role.at_least(Role.ADMIN):
        return volumes.prefetch_related("shares__project")
    own_home = Q(kind=VolumeKind.HOME, owner=actor.user) if actor.user is not None else Q(pk__in=[])
    projects = _member_projects(actor, tenant)
    shared = Q(project_id__in=projects) | Q(shares__project_id__in=projects)
    return volumes.filter(own_home | (~Q(kind=VolumeKind.HOME) & shared)).distinct().prefetch_related("shares__project")
