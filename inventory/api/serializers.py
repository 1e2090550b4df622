"""Serializers of the inventory API."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from inventory.models import NodePool
from tenants.api.fields import ScopedSlugField
from tenants.models import Tenant


def _tenants(context: dict[str, Any]) -> Any:
    return Tenant.objects.all()


class NodePoolSerializer(serializers.ModelSerializer):
    dedicated_tenant: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )

    class Meta:
        model = NodePool
        fields = ["name", "description", "dedicated_tenant", "created_at", "updated_at"]
        read_only_fields = fields


class NodePoolCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=40)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    dedicated_tenant = ScopedSlugField(selector=_tenants, required=False, allow_null=True, default=None)


class NodePoolUpdateSerializer(serializers.Serializer):
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    dedicated_tenant = ScopedSlugField(selector=_tenants, required=False, allow_null=True)
