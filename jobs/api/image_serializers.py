"""Serializers of the image allow-list and the launch presets (read shapes and input shapes)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from common.api.fields import Integer
from jobs.api.serializers import WorkloadKindField, resolve_references
from jobs.models import AllowedImage, LaunchPreset
from jobs.services.presets import PRESET_FIELDS
from tenants.api.fields import ScopedSlugField
from tenants.models import Tenant


def _tenants(context: dict[str, Any]) -> Any:
    return Tenant.objects.all()


class AllowedImageSerializer(serializers.ModelSerializer):
    """An allowed image pattern; `tenant` is null for a platform-wide one."""

    tenant: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )

    class Meta:
        model = AllowedImage
        fields = ["id", "tenant", "pattern", "notebook", "description", "created_at"]
        read_only_fields = fields


class AllowedImageCreateSerializer(serializers.Serializer):
    """A pattern to allow: for one tenant (its slug), or for every tenant when `tenant` is left out or null."""

    pattern = serializers.CharField(max_length=255, trim_whitespace=False)
    tenant = ScopedSlugField(selector=_tenants, required=False, allow_null=True, default=None)
    notebook = serializers.BooleanField(default=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class LaunchPresetSerializer(serializers.ModelSerializer):
    pool: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    kind = WorkloadKindField(read_only=True)

    class Meta:
        model = LaunchPreset
        fields = ["id", *PRESET_FIELDS, "created_at", "updated_at"]
        read_only_fields = fields


class LaunchPresetInputSerializer(serializers.Serializer):
    """A preset's fields; on update, only those sent change. The pool is a name among the tenant's pools."""

    name = serializers.CharField(max_length=63, trim_whitespace=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    kind = WorkloadKindField(required=False)
    image = serializers.CharField(max_length=255)
    command = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False
    )
    pool = serializers.CharField(max_length=40)
    gpus_per_replica = Integer(required=False)
    replicas = Integer(required=False)
    cpu_milli = Integer(required=False)
    memory_mib = Integer(required=False)
    shm_mib = Integer(required=False, allow_null=True)
    idle_timeout_seconds = Integer(required=False, allow_null=True)
    max_runtime_seconds = Integer(required=False, allow_null=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        resolve_references([attrs], self.context, "")
        return attrs
