"""Serializers of the inventory API."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from common.api.fields import Integer
from inventory.choices import NodeKind, PlacementPolicy, RuntimeKind
from inventory.models import (
    DEFAULT_USAGE_HALF_LIFE_SECONDS,
    MAX_USAGE_HALF_LIFE_SECONDS,
    Gpu,
    Node,
    NodeEvent,
    NodePool,
)
from tenants.api.fields import ScopedSlugField
from tenants.models import Tenant


def _tenants(context: dict[str, Any]) -> Any:
    return Tenant.objects.all()


class GpuCapacitySerializer(serializers.Serializer):
    model = serializers.CharField()
    total = Integer()
    free = Integer()


class NodePoolSerializer(serializers.ModelSerializer):
    dedicated_tenant: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )

    class Meta:
        model = NodePool
        fields = [
            "name",
            "description",
            "dedicated_tenant",
            "placement_policy",
            "usage_half_life_seconds",
            "capacity",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    capacity = serializers.SerializerMethodField()

    @extend_schema_field(GpuCapacitySerializer(many=True))
    def get_capacity(self, pool: NodePool) -> list[dict[str, Any]]:
        """Total and free GPUs per model; filled in by the view for the whole page at once."""
        return self.context.get("capacity", {}).get(pool.pk, [])


_HALF_LIFE = "Seconds after which past GPU use counts half in fair share (default 7 days); 0: none counts."


class NodePoolCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=40)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    dedicated_tenant = ScopedSlugField(selector=_tenants, required=False, allow_null=True, default=None)
    placement_policy = serializers.ChoiceField(choices=PlacementPolicy.choices, default=PlacementPolicy.BINPACK)
    usage_half_life_seconds = Integer(
        min_value=0,
        max_value=MAX_USAGE_HALF_LIFE_SECONDS,
        default=DEFAULT_USAGE_HALF_LIFE_SECONDS,
        help_text=_HALF_LIFE,
    )


class NodePoolUpdateSerializer(serializers.Serializer):
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    placement_policy = serializers.ChoiceField(choices=PlacementPolicy.choices, required=False)
    usage_half_life_seconds = Integer(
        min_value=0, max_value=MAX_USAGE_HALF_LIFE_SECONDS, required=False, help_text=_HALF_LIFE
    )
    dedicated_tenant = ScopedSlugField(selector=_tenants, required=False, allow_null=True)


class NodeSerializer(serializers.ModelSerializer):
    pool: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    agent_queue = serializers.CharField(read_only=True)
    simulated = serializers.BooleanField(source="is_simulated", read_only=True)
    isolated = serializers.SerializerMethodField()
    gpu_count = Integer(read_only=True, default=None)
    failed_gpu_count = Integer(read_only=True, default=None)

    class Meta:
        model = Node
        fields = [
            "name", "pool", "kind", "runtime", "simulated", "isolated", "address", "labels", "cpu_cores",
            "memory_mib", "simulated_gpu_count", "simulated_gpu_model", "state", "state_reason", "state_changed_at",
            "agent_queue", "last_heartbeat_at", "agent_version", "engine_version", "runc_version",
            "nvidia_driver_version", "cuda_version", "toolkit_version", "nvidia_runtime", "device_requests",
            "swarm", "swarm_manager", "probed_at", "gpu_count", "failed_gpu_count", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = fields

    def get_isolated(self, node: Node) -> bool:
        """Whether workloads on this node are isolated from the host (false for the process runtime)."""
        return node.runtime != RuntimeKind.PROCESS


def _pools(context: dict[str, Any]) -> Any:
    return NodePool.objects.all()


class JoinTokenRequestSerializer(serializers.Serializer):
    expires_in = Integer(min_value=60, max_value=7 * 86400, required=False, default=3600, help_text="Seconds.")


class JoinTokenSerializer(serializers.Serializer):
    """A join token, shown once, and the command that joins a host with it."""

    node = serializers.CharField()
    token = serializers.CharField()
    expires_at = serializers.DateTimeField()
    command = serializers.CharField()


class NodeAgentSerializer(serializers.Serializer):
    """The node's live agent credential: which host joined, when, when it was last heard."""

    host = serializers.CharField()
    joined_at = serializers.DateTimeField(source="created_at")
    last_seen_at = serializers.DateTimeField(allow_null=True)


class NodeCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    pool = ScopedSlugField(selector=_pools, slug_field="name")
    kind = serializers.ChoiceField(choices=NodeKind.choices, default=NodeKind.BARE_METAL)
    runtime = serializers.ChoiceField(choices=RuntimeKind.choices, default=RuntimeKind.DOCKER)
    address = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    labels = serializers.DictField(child=serializers.CharField(max_length=255, allow_blank=True), required=False)
    cpu_cores = Integer(min_value=0, max_value=100_000, required=False, default=0)
    memory_mib = Integer(min_value=0, max_value=1 << 40, required=False, default=0)
    simulated_gpu_count = Integer(min_value=0, max_value=64, required=False, default=0)
    simulated_gpu_model = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")


class NodeUpdateSerializer(serializers.Serializer):
    pool = ScopedSlugField(selector=_pools, slug_field="name", required=False)
    address = serializers.CharField(max_length=255, required=False, allow_blank=True)
    labels = serializers.DictField(child=serializers.CharField(max_length=255, allow_blank=True), required=False)


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class GpuSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = Gpu
        fields = [
            "node", "index", "uuid", "model", "memory_mib", "mig_mode", "health", "health_reason",
            "health_changed_at", "utilization", "memory_used_mib", "last_sample", "last_sample_at",
        ]  # fmt: skip
        read_only_fields = fields


class NodeEventSerializer(serializers.ModelSerializer):
    gpu = serializers.SerializerMethodField()

    class Meta:
        model = NodeEvent
        fields = ["id", "kind", "from_state", "to_state", "message", "data", "actor_label", "gpu", "created_at"]
        read_only_fields = fields

    def get_gpu(self, event: NodeEvent) -> str | None:
        return event.gpu.uuid if event.gpu is not None else None
