"""Serializers of the storage API: volumes, their shares and files, and storage backends."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rest_framework import serializers

from common.api.fields import ID_MAX, Integer
from inventory.choices import FileKind, StorageKind, VolumeKind
from inventory.models import Node, NodePool, StorageBackend, Volume, VolumeShare
from inventory.services.volume_access import mount_target
from inventory.services.volume_files import FileEntry
from tenants.api.fields import ScopedSlugField
from tenants.selectors import projects_in_scope

MAX_PATH = 4096
"""The longest path a file request may name (Linux's PATH_MAX)."""
FILE_PAGE = 200
MAX_FILE_PAGE = 1000


def _projects(context: dict[str, Any]) -> Any:
    return projects_in_scope()


def _size(help_text: str, **kwargs: Any) -> Integer:
    return Integer(min_value=0, max_value=ID_MAX, help_text=help_text, **kwargs)


class VolumeShareSerializer(serializers.ModelSerializer):
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = VolumeShare
        fields = ["project", "read_only", "created_at"]
        read_only_fields = fields


class VolumeSerializer(serializers.ModelSerializer):
    backend: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    owner: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    mount_path = serializers.SerializerMethodField()
    shares = VolumeShareSerializer(many=True, read_only=True)
    can_read = serializers.SerializerMethodField()
    can_write = serializers.SerializerMethodField()

    class Meta:
        model = Volume
        fields = [
            "id", "kind", "name", "description", "backend", "project", "owner", "mount_path", "size_limit_bytes",
            "used_bytes", "used_measured_at", "shares", "can_read", "can_write", "created_at",
        ]  # fmt: skip
        read_only_fields = fields

    def get_mount_path(self, volume: Volume) -> str:
        """Where workloads see the volume: /home/<user>, /projects/<name> or /datasets/<name>."""
        return mount_target(volume)

    def get_can_read(self, volume: Volume) -> bool:
        """Whether you may list and download its files (a home's are its owner's alone)."""
        rights = self.context.get("rights", {}).get(volume.pk)
        return bool(rights and rights.read)

    def get_can_write(self, volume: Volume) -> bool:
        """Whether you may upload, make folders and delete in it."""
        rights = self.context.get("rights", {}).get(volume.pk)
        return bool(rights and rights.write)


class VolumeCreateSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=VolumeKind.choices, help_text="`project` or `dataset`.")
    name = serializers.CharField(max_length=40, help_text="Mounted at /projects/<name> or /datasets/<name>.")
    project = ScopedSlugField(selector=_projects, required=False, allow_null=True, default=None)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    size_limit_bytes = _size("The volume's own limit; null: only the quotas.", required=False, allow_null=True)


class VolumeUpdateSerializer(serializers.Serializer):
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    size_limit_bytes = _size("The volume's own limit; null: only the quotas.", required=False, allow_null=True)


class VolumeShareCreateSerializer(serializers.Serializer):
    project = ScopedSlugField(selector=_projects)
    # The serializer metaclass takes declared fields off the class, so this does not shadow Field.read_only.
    read_only = serializers.BooleanField(  # type: ignore[assignment]  # a field named like a Field attribute
        default=True, help_text="Datasets are always shared read-only."
    )


class FileQuerySerializer(serializers.Serializer):
    path = serializers.CharField(
        max_length=MAX_PATH, required=False, allow_blank=True, default="", trim_whitespace=False,
        help_text="A folder of the volume, relative to its top (empty: the top).",
    )  # fmt: skip
    limit = Integer(min_value=1, max_value=MAX_FILE_PAGE, default=FILE_PAGE)
    offset = Integer(min_value=0, max_value=ID_MAX, default=0)


class FilePathSerializer(serializers.Serializer):
    path = serializers.CharField(
        max_length=MAX_PATH, trim_whitespace=False, help_text="A file or folder of the volume, relative to its top."
    )


class FileEntrySerializer(serializers.Serializer):
    name = serializers.CharField()
    path = serializers.CharField(help_text="Relative to the volume's top: what `?path=` takes.")
    kind = serializers.ChoiceField(choices=FileKind.choices)
    size = Integer(min_value=0, max_value=ID_MAX)
    modified = serializers.DateTimeField()


class FileListingSerializer(serializers.Serializer):
    path = serializers.CharField()
    offset = Integer(min_value=0, max_value=ID_MAX)
    limit = Integer(min_value=1, max_value=MAX_FILE_PAGE)
    more = serializers.BooleanField(help_text="Whether entries follow this page: ask again with offset + limit.")
    entries = FileEntrySerializer(many=True)


class UploadedSerializer(serializers.Serializer):
    path = serializers.CharField()
    size = Integer(min_value=0, max_value=ID_MAX, help_text="Bytes written.")


class DeletedSerializer(serializers.Serializer):
    path = serializers.CharField()
    freed_bytes = Integer(min_value=0, max_value=ID_MAX)


def entry_row(folder: str, entry: FileEntry) -> dict[str, Any]:
    """Return one entry of folder `folder` as the API shows it."""
    return {
        "name": entry.name,
        "path": f"{folder.strip('/')}/{entry.name}" if folder.strip("/") else entry.name,
        "kind": entry.kind,
        "size": entry.size,
        "modified": datetime.fromtimestamp(entry.modified, tz=UTC),
    }


class StorageBackendSerializer(serializers.ModelSerializer):
    node: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    pools: Any = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)

    class Meta:
        model = StorageBackend
        fields = ["name", "kind", "path", "console_path", "node", "pools", "is_default", "created_at"]
        read_only_fields = fields


def _nodes(context: dict[str, Any]) -> Any:
    return Node.objects.all()


def _pools(context: dict[str, Any]) -> Any:
    return NodePool.objects.all()


class StorageBackendCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=40)
    kind = serializers.ChoiceField(choices=StorageKind.choices, default=StorageKind.SHARED)
    path = serializers.CharField(max_length=500, help_text="The root as every host that mounts it sees it.")
    console_path = serializers.CharField(
        max_length=500, required=False, allow_blank=True, default="",
        help_text="Where the console reaches the same tree (empty: at `path`).",
    )  # fmt: skip
    node = ScopedSlugField(selector=_nodes, slug_field="name", required=False, allow_null=True, default=None)
    pools = ScopedSlugField(selector=_pools, slug_field="name", many=True, required=False, default=list)
    is_default = serializers.BooleanField(default=False)
