"""Storage: the backends operators configure and the volumes tenants keep on them.

A `StorageBackend` is a directory tree that hosts mount: a node-local
directory (one node) or a shared filesystem mounted at the same path on
every host of some pools. A `Volume` is one directory below a backend's
root that belongs to a tenant: a member's home, a project volume, or a
dataset. Workloads ask for volumes; where they are on a host is the
backend's business (`inventory.services.volumes`).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from inventory.choices import StorageKind, VolumeKind
from tenants.models import SLUG_RULE
from tenants.scoping import TenantOwnedModel


class StorageBackend(models.Model):
    """A root directory for volumes, and which nodes can mount it.

    `path` is the root as every host that mounts it sees it; `console_path`
    where the console itself reaches the same tree (empty: at `path`; the
    file browser and usage need it). `marker` is written to
    `<root>/.gpucloud-storage` when the console creates the root: a host
    whose `path` lacks it has not mounted the filesystem, and starts nothing
    there. A local backend lives on `node` alone; a shared one on every node
    of `pools` (every pool when none is named).
    """

    name = models.CharField(max_length=40, unique=True, validators=[SLUG_RULE])
    kind = models.CharField(max_length=16, choices=StorageKind.choices, default=StorageKind.SHARED)
    path = models.CharField(max_length=500)
    console_path = models.CharField(max_length=500, blank=True)
    node = models.ForeignKey(
        "inventory.Node", on_delete=models.PROTECT, null=True, blank=True, related_name="storage_backends"
    )
    pools = models.ManyToManyField("inventory.NodePool", blank=True, related_name="storage_backends")
    marker = models.CharField(max_length=64)
    is_default = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=Q(is_default=True), name="one_default_backend"),
            models.CheckConstraint(
                condition=Q(kind=StorageKind.SHARED) | Q(node__isnull=False), name="local_backend_has_node"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def console_root(self) -> str:
        """Where the console reaches this backend's root."""
        return self.console_path or self.path


class Volume(TenantOwnedModel):
    """One directory of a tenant's on a backend: a home (per user), a project volume or a dataset.

    `directory` is relative to the backend's root and never changes. A home
    belongs to `owner`; a project volume and a dataset to `project` (a
    dataset with no project is the tenant's, managed by its admins).
    `size_limit_bytes` caps this volume alone (None: only the tenant's and
    project's quotas); `used_bytes` is what the last measurement found.
    """

    kind = models.CharField(max_length=16, choices=VolumeKind.choices)
    name = models.CharField(max_length=40, validators=[SLUG_RULE])
    description = models.CharField(max_length=200, blank=True)
    backend = models.ForeignKey(StorageBackend, on_delete=models.PROTECT, related_name="volumes")
    directory = models.CharField(max_length=300)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="home_volumes"
    )
    project = models.ForeignKey(
        "tenants.Project", on_delete=models.PROTECT, null=True, blank=True, related_name="volumes"
    )
    size_limit_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    used_bytes = models.PositiveBigIntegerField(default=0)
    used_measured_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "owner"], condition=Q(kind=VolumeKind.HOME), name="one_home_per_user_and_tenant"
            ),
            # Project volumes and datasets are mounted by name (/projects/<name>, /datasets/<name>).
            models.UniqueConstraint(
                fields=["tenant", "name"], condition=~Q(kind=VolumeKind.HOME), name="volume_name_unique_per_tenant"
            ),
            models.UniqueConstraint(fields=["backend", "directory"], name="volume_directory_unique"),
            models.CheckConstraint(
                condition=~Q(kind=VolumeKind.HOME) | Q(owner__isnull=False), name="home_volume_has_owner"
            ),
            models.CheckConstraint(
                condition=~Q(kind=VolumeKind.PROJECT) | Q(project__isnull=False), name="project_volume_has_project"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


class VolumeShare(TenantOwnedModel):
    """A project volume or dataset shared with another project of the same tenant (datasets always read-only)."""

    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="shares")
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, related_name="volume_shares")
    read_only = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["volume_id", "project_id"]
        constraints = [models.UniqueConstraint(fields=["volume", "project"], name="volume_share_unique")]

    def __str__(self) -> str:
        return f"{self.volume_id}->{self.project_id}"
