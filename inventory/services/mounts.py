"""What a workload mounts, where, and as whom; and which storage backends a node must reach for it.

Every workload of (owner, project) mounts, at fixed paths:

- `/home/<user>`: the owner's home in the tenant (read-write; the working
  directory and `HOME`);
- `/projects/<name>`: the project's own volumes (read-write) and project
  volumes shared with the project (read-write unless the share is read-only);
- `/datasets/<name>`: datasets of the project and datasets shared with it,
  always read-only.

It runs as uid `STORAGE_UID_BASE + user id` with the project's gid
`STORAGE_GID_BASE + project id`, and the gids of every project whose
volumes it mounts as supplementary groups: files are the user's on every
host, and a project volume's members share its group.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User

from inventory.choices import VolumeKind
from inventory.models import StorageBackend, Volume, VolumeShare
from inventory.services.storage import DEFAULT_BACKEND_NAME
from inventory.services.volume_access import directory_owner, gid_of, host_path, mount_target, uid_of
from inventory.services.volumes import home_volume, project_volume
from tenants.models import Project, Tenant
from tenants.scoping import tenant_scope

CHECKPOINTS = ".checkpoints"


@dataclass(frozen=True)
class PlannedMount:
    """One volume mounted into a workload: where, and whether read-only."""

    volume: Volume
    target: str
    read_only: bool


def plan_mounts(*, tenant: Tenant, owner: User, project: Project) -> list[PlannedMount]:
    """Return the mounts of a workload of `owner` in `project`: its home first, its project's own volume second.

    Makes the owner's home and the project's own volume on first use. Reads in `tenant`'s scope (the
    controller's launch calls it with none active).
    """
    home = home_volume(tenant=tenant, user=owner)
    own = project_volume(project=project)
    with tenant_scope(tenant):
        others = list(
            Volume.objects.filter(project=project)
            .exclude(kind=VolumeKind.HOME)
            .exclude(pk=own.pk)
            .select_related("backend")
        )
        shares = list(VolumeShare.objects.filter(project=project).select_related("volume__backend", "volume__owner"))
    mounts = [_planned(home, read_only=False), _planned(own, read_only=False)]
    for volume in sorted(others, key=lambda v: (v.kind, v.name)):
        mounts.append(_planned(volume, read_only=volume.kind == VolumeKind.DATASET))
    for share in sorted(shares, key=lambda s: (s.volume.kind, s.volume.name)):
        mounts.append(_planned(share.volume, read_only=share.read_only or share.volume.kind == VolumeKind.DATASET))
    return mounts


def _planned(volume: Volume, *, read_only: bool) -> PlannedMount:
    return PlannedMount(volume, mount_target(volume), read_only)


def project_dir(mounts: list[PlannedMount]) -> str:
    """Return where the project's own volume is mounted (`GPUCLOUD_PROJECT_DIR`) among `plan_mounts`' mounts."""
    return mounts[1].target


def checkpoint_dir(mounts: list[PlannedMount], workload_id: int) -> str:
    """Return `GPUCLOUD_CHECKPOINT_DIR` for a workload: on its project's own volume, the same for every attempt."""
    return f"{project_dir(mounts)}/{CHECKPOINTS}/{workload_id}"


def checkpoint_host_dirs(workloads: Iterable[tuple[int, int]], *, console: bool = True) -> dict[int, str]:
    """Return each (workload id, project id)'s checkpoint directory as the console reaches it (else as the
    nodes do: `console=False`), by workload id.

    One query for any number: a project's own volume is its oldest project
    volume (`project_volume`). A project without one yet has no checkpoints.
    """
    pairs = list(workloads)
    own: dict[int, Volume] = {}
    volumes = Volume.all_tenants.filter(kind=VolumeKind.PROJECT, project_id__in={p for _, p in pairs})
    for volume in volumes.select_related("backend").order_by("-created_at", "-pk"):
        if volume.project_id is not None:  # always, for a project volume (a constraint says so)
            own[volume.project_id] = volume  # the oldest is written last
    return {
        workload: f"{host_path(own[project].backend, own[project], console=console)}/{CHECKPOINTS}/{workload}"
        for workload, project in pairs
        if project in own
    }


def mount_specs(mounts: list[PlannedMount], workload_id: int) -> list[dict[str, Any]]:
    """Return the agent's JSON for `plan_mounts`' `mounts` of a workload: host source below the backend's root,
    target, read-only, owner, and the directories the workload expects in it (the agent makes them with the
    volume's owner and mode: its checkpoint directory, on the project's own volume)."""
    specs = []
    for index, mount in enumerate(mounts):
        backend = mount.volume.backend
        uid, gid, mode = directory_owner(mount.volume)
        specs.append(
            {
                "source": host_path(backend, mount.volume),
                "target": mount.target,
                "read_only": mount.read_only,
                "root": backend.path,
                "marker": backend.marker,
                "uid": uid,
                "gid": gid,
                "mode": mode,
                "subdirs": [f"{CHECKPOINTS}/{workload_id}"] if index == 1 else [],
            }
        )
    return specs


def checkpoint_node_dir(specs: list[dict[str, Any]], workload_id: int) -> str:
    """Return where a node finds the workload's checkpoint directory, among its `mount_specs`."""
    return f"{specs[1]['source']}/{CHECKPOINTS}/{workload_id}"


def run_as(mounts: list[PlannedMount], owner: User, project: Project) -> dict[str, Any]:
    """Return the uid, gid and supplementary groups a workload of `owner` in `project` runs with."""
    groups = {uid_of(owner), gid_of(None)}
    for mount in mounts:
        if mount.volume.kind != VolumeKind.HOME and mount.volume.project_id != project.pk:
            groups.add(gid_of(mount.volume.project_id))
    return {"uid": uid_of(owner), "gid": gid_of(project.pk), "groups": sorted(groups)}


def storage_needs(pairs: Iterable[tuple[int, int, int]]) -> dict[tuple[int, int], frozenset[str]]:
    """Return, for each (tenant, owner, project), the backends its workloads' volumes are on, keyed (owner, project).

    Two queries for any number of pairs (the scheduling pass asks once). A
    home or project volume not made yet will be on the default backend.
    """
    pairs = set(pairs)
    if not pairs:
        return {}
    owners = {owner for _, owner, _ in pairs}
    projects = {project for _, _, project in pairs}
    homes: dict[tuple[int, int], str] = {}
    by_project: dict[int, set[str]] = {}
    own_volume: set[int] = set()
    rows = Volume.all_tenants.filter(kind=VolumeKind.HOME, owner_id__in=owners).values_list(
        "tenant_id", "owner_id", "backend__name"
    )
    for tenant_id, owner_id, backend in rows:
        homes[(tenant_id, owner_id)] = backend
    project_rows = Volume.all_tenants.filter(project_id__in=projects).exclude(kind=VolumeKind.HOME)
    for project_id, kind, backend in project_rows.values_list("project_id", "kind", "backend__name"):
        by_project.setdefault(project_id, set()).add(backend)
        if kind == VolumeKind.PROJECT:
            own_volume.add(project_id)
    shared = VolumeShare.all_tenants.filter(project_id__in=projects).values_list("project_id", "volume__backend__name")
    for project_id, backend in shared:
        by_project.setdefault(project_id, set()).add(backend)
    fallback = _default_name(pairs, homes, own_volume)
    needs: dict[tuple[int, int], frozenset[str]] = {}
    for tenant_id, owner_id, project_id in pairs:
        names = set(by_project.get(project_id, ()))
        names.add(homes.get((tenant_id, owner_id)) or fallback)
        if project_id not in own_volume:
            names.add(fallback)
        needs[(owner_id, project_id)] = frozenset(name for name in names if name)
    return needs


def _default_name(pairs: set[tuple[int, int, int]], homes: dict[tuple[int, int], str], own_volume: set[int]) -> str:
    """Return the default backend's name when some home or project volume is yet to be made, else "".

    One query, always (so a pass reads a fixed number): the backend marked
    default, or the one named `default` that `default_backend` will make.
    """
    marked = StorageBackend.objects.filter(is_default=True).values_list("name", flat=True).first()
    missing = any((t, o) not in homes or p not in own_volume for t, o, p in pairs)
    return (marked or DEFAULT_BACKEND_NAME) if missing else ""
