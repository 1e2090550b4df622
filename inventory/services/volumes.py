"""Volumes: homes made on first use, project volumes and datasets, and sharing them between projects.

Who may see and change what is `inventory.services.volume_access`'s.
"""

from __future__ import annotations

import uuid

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.http import Http404

from common.errors import Conflict
from inventory.choices import VolumeKind
from inventory.models import StorageBackend, Volume, VolumeShare
from inventory.services import volume_files
from inventory.services.storage import default_backend
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Project, Tenant
from tenants.scoping import tenant_scope
from tenants.services import delete_audited, record_audit_event, snapshot, update_audited
from tenants.services.access import require_role
from tenants.services.validation import clean_fields

VOLUME_FIELDS = ["kind", "name", "description", "backend", "project", "owner", "size_limit_bytes"]


def volume_directory(tenant: Tenant, kind: str) -> str:
    """Return a fresh directory for a volume, relative to its backend's root (never reused, never renamed)."""
    return f"t{tenant.pk}/{kind}/{uuid.uuid4().hex}"


def home_volume(*, tenant: Tenant, user: User) -> Volume:
    """Return `user`'s home in `tenant`, creating it on the default backend on first use (idempotent).

    Reads and writes in `tenant`'s scope, whatever scope (if any) the caller runs in.
    """
    with tenant_scope(tenant):
        found = Volume.objects.filter(kind=VolumeKind.HOME, owner=user).select_related("backend").first()
        if found is not None:
            return found
        backend = default_backend()
        try:
            with transaction.atomic():
                return Volume.objects.create(
                    tenant=tenant,
                    kind=VolumeKind.HOME,
                    name=f"home-{user.pk}",
                    backend=backend,
                    directory=volume_directory(tenant, VolumeKind.HOME),
                    owner=user,
                )
        except IntegrityError:  # made concurrently
            return Volume.objects.select_related("backend").get(kind=VolumeKind.HOME, owner=user)


def project_volume(*, project: Project) -> Volume:
    """Return the project's own volume (its oldest), creating one named after the project on first use.

    Jobs keep their checkpoints on it. The name is the project's slug, or
    `<slug>-files` when a dataset took that name first.
    """
    found = Volume.all_tenants.filter(project=project, kind=VolumeKind.PROJECT).order_by("created_at", "pk").first()
    if found is not None:
        return found
    backend = default_backend()
    for name in (project.slug, f"{project.slug}-files", f"{project.slug}-{uuid.uuid4().hex[:6]}"):
        try:
            with transaction.atomic():
                return Volume.all_tenants.create(
                    tenant_id=project.tenant_id,
                    kind=VolumeKind.PROJECT,
                    name=name[:40],
                    backend=backend,
                    directory=volume_directory(project.tenant, VolumeKind.PROJECT),
                    project=project,
                )
        except IntegrityError:
            found = Volume.all_tenants.filter(project=project, kind=VolumeKind.PROJECT).order_by("pk").first()
            if found is not None:
                return found
    raise Conflict(f"Could not name project {project.slug}'s volume.", code="volume_name_taken")


@transaction.atomic
def create_volume(
    *,
    actor: Actor,
    tenant: Tenant,
    kind: str,
    name: str,
    project: Project | None = None,
    description: str = "",
    size_limit_bytes: int | None = None,
    backend: StorageBackend | None = None,
) -> Volume:
    """Create a project volume or a dataset in `tenant` (tenant admins) and return it.

    Raises ValidationError naming every failing field at once (a home is
    made only on first use, a project volume needs its project, a taken name).
    """
    require_role(actor, tenant, Role.ADMIN)
    errors: dict[str, list[str]] = {}
    if kind not in (VolumeKind.PROJECT, VolumeKind.DATASET):
        errors["kind"] = ["Create a project volume or a dataset; homes are made on first use."]
    if kind == VolumeKind.PROJECT and project is None:
        errors["project"] = ["A project volume belongs to a project: name it."]
    if project is not None and project.tenant_id != tenant.pk:
        errors["project"] = ["No such project in this tenant."]
    with tenant_scope(tenant):
        taken = Volume.objects.filter(name=name).exclude(kind=VolumeKind.HOME).exists()
    if taken:
        errors.setdefault("name", []).append(f"A volume named {name} exists already in this tenant.")
    volume = Volume(
        tenant=tenant,
        kind=kind,
        name=name,
        description=description,
        project=project,
        size_limit_bytes=size_limit_bytes,
        backend=backend or default_backend(),
        directory=volume_directory(tenant, kind or "volume"),
    )
    try:
        clean_fields(volume, exclude=["tenant", "backend", "owner", "project"])
    except ValidationError as error:
        for field, messages in error.message_dict.items():
            errors.setdefault(field, []).extend(messages)
    if errors:
        raise ValidationError(errors)
    volume.save(force_insert=True)
    record_audit_event(
        actor=actor, action="volume.create", obj=volume, tenant_id=tenant.pk, after=snapshot(volume, VOLUME_FIELDS)
    )
    return volume


@transaction.atomic
def update_volume(*, actor: Actor, volume: Volume, **changes: object) -> Volume:
    """Change a volume's description or size limit (tenant admins); every failing field named at once."""
    require_role(actor, volume.tenant, Role.ADMIN)
    allowed = {"description", "size_limit_bytes"}
    unknown = sorted(set(changes) - allowed)
    if unknown:
        raise ValidationError({name: ["This field cannot be changed."] for name in unknown})
    with tenant_scope(volume.tenant):
        locked = Volume.objects.select_for_update().get(pk=volume.pk)
    return update_audited(
        actor=actor,
        action="volume.update",
        obj=locked,
        changes=changes,
        tenant_id=volume.tenant_id,
        audited=VOLUME_FIELDS,
    )


@transaction.atomic
def delete_volume(*, actor: Actor, volume: Volume) -> None:
    """Delete an empty project volume or dataset (tenant admins).

    Raises Conflict for a home (it goes with its member) and for a volume
    that still holds files: deleting files is the file browser's, one
    visible step, never a side effect (a running workload may still use them).
    """
    require_role(actor, volume.tenant, Role.ADMIN)
    if volume.kind == VolumeKind.HOME:
        raise Conflict("A home is kept as long as its member is.", code="home_volume")
    if volume_files.has_files(volume):
        raise Conflict(f"Volume {volume.name} still holds files; delete them first.", code="volume_not_empty")
    delete_audited(actor=actor, action="volume.delete", obj=volume, tenant_id=volume.tenant_id, audited=VOLUME_FIELDS)


@transaction.atomic
def share_volume(*, actor: Actor, volume: Volume, project: Project, read_only: bool = True) -> VolumeShare:
    """Share a project volume or dataset with another project of its tenant (tenant admins); idempotent.

    A dataset is always shared read-only; a home is never shared.
    """
    require_role(actor, volume.tenant, Role.ADMIN)
    errors: dict[str, list[str]] = {}
    if volume.kind == VolumeKind.HOME:
        errors["volume"] = ["A home is its member's alone."]
    if project.tenant_id != volume.tenant_id:
        errors["project"] = ["No such project in this tenant."]
    elif project.pk == volume.project_id:
        errors["project"] = ["The volume belongs to this project already."]
    if volume.kind == VolumeKind.DATASET and not read_only:
        errors["read_only"] = ["Datasets are mounted read-only."]
    if errors:
        raise ValidationError(errors)
    with tenant_scope(volume.tenant):
        share, created = VolumeShare.objects.update_or_create(
            volume=volume, project=project, defaults={"tenant_id": volume.tenant_id, "read_only": read_only}
        )
    record_audit_event(
        actor=actor,
        action="volume.share" if created else "volume.share_update",
        obj=volume,
        tenant_id=volume.tenant_id,
        after={"project": project.slug, "read_only": read_only},
    )
    return share


@transaction.atomic
def unshare_volume(*, actor: Actor, volume: Volume, project: Project) -> None:
    """Stop sharing `volume` with `project` (tenant admins); workloads already running keep their mount."""
    require_role(actor, volume.tenant, Role.ADMIN)
    with tenant_scope(volume.tenant):
        deleted, _ = VolumeShare.objects.filter(volume=volume, project=project).delete()
    if not deleted:
        raise Http404("The volume is not shared with this project.")
    record_audit_event(
        actor=actor, action="volume.unshare", obj=volume, tenant_id=volume.tenant_id, before={"project": project.slug}
    )
