"""Node pools, nodes, their GPUs and the events operators read."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from inventory.choices import GpuHealth, MigMode, NodeKind, NodeState, PlacementPolicy, RuntimeKind
from tenants.models import SLUG_RULE

DEFAULT_USAGE_HALF_LIFE_SECONDS = 7 * 24 * 3600
MAX_USAGE_HALF_LIFE_SECONDS = 365 * 24 * 3600


class NodePool(models.Model):
    """A group of nodes that quotas are expressed against.

    A pool with a dedicated tenant is usable by that tenant alone; other
    tenants never see it.
    """

    name = models.CharField(max_length=40, unique=True, validators=[SLUG_RULE])
    description = models.TextField(blank=True, max_length=2000)
    dedicated_tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, null=True, blank=True, related_name="dedicated_pools"
    )
    placement_policy = models.CharField(max_length=20, choices=PlacementPolicy.choices, default=PlacementPolicy.BINPACK)
    # Seconds a stopped or preempted workload gets between SIGTERM and SIGKILL; empty means the default.
    stop_grace_seconds = models.PositiveIntegerField(null=True, blank=True)
    # How fast past use stops counting in fair share: a GPU-second used this long ago weighs half (Slurm's
    # PriorityDecayHalfLife, whose default of 7 days it takes); 0: history counts for nothing.
    usage_half_life_seconds = models.PositiveIntegerField(
        default=DEFAULT_USAGE_HALF_LIFE_SECONDS, validators=[MaxValueValidator(MAX_USAGE_HALF_LIFE_SECONDS)]
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


NODE_NAME_RULE = RegexValidator(
    r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$",
    "Use 1 to 63 lowercase letters, digits, dots or hyphens, starting and ending with a letter or digit.",
    code="invalid_node_name",
)


class Node(models.Model):
    """A machine whose GPUs the cloud schedules onto.

    The controller reaches the node's agent through its Celery queue
    (`agent_queue`); simulated nodes have no agent: their node-local work runs
    on the controller. The versions are what the last provisioning probe found.
    """

    name = models.CharField(max_length=63, unique=True, validators=[NODE_NAME_RULE])
    pool = models.ForeignKey(NodePool, on_delete=models.PROTECT, related_name="nodes")
    kind = models.CharField(max_length=20, choices=NodeKind.choices, default=NodeKind.BARE_METAL)
    runtime = models.CharField(max_length=20, choices=RuntimeKind.choices, default=RuntimeKind.DOCKER)
    address = models.CharField(max_length=255, blank=True, help_text="Host name or IP other nodes reach it at.")
    labels = models.JSONField(default=dict, blank=True)
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveBigIntegerField(default=0)
    # Only for simulated nodes: the GPUs the simulated probe reports.
    simulated_gpu_count = models.PositiveSmallIntegerField(default=0)
    simulated_gpu_model = models.CharField(max_length=100, blank=True)

    state = models.CharField(max_length=20, choices=NodeState.choices, default=NodeState.REGISTERED)
    state_reason = models.TextField(blank=True, max_length=2000)
    state_changed_at = models.DateTimeField(default=timezone.now)
    # The live state an outage interrupted, restored when heartbeats resume.
    resume_state = models.CharField(max_length=20, choices=NodeState.choices, blank=True)
    # Bumped on every provisioning start; stale workflow steps compare it and stop.
    provisioning_attempt = models.PositiveIntegerField(default=0)

    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Timestamp (seconds since the epoch, node clock) of the newest GPU sample rolled up into GpuMinute:
    # a replayed report's samples at or before it are skipped. A float, not a datetime, so it compares
    # exactly with the samples' own timestamps.
    samples_rolled_up_until = models.FloatField(null=True, blank=True)
    agent_version = models.CharField(max_length=40, blank=True)
    engine_version = models.CharField(max_length=40, blank=True)
    runc_version = models.CharField(max_length=40, blank=True)
    nvidia_driver_version = models.CharField(max_length=40, blank=True)
    cuda_version = models.CharField(max_length=40, blank=True)
    toolkit_version = models.CharField(max_length=40, blank=True)
    nvidia_runtime = models.BooleanField(default=False)
    device_requests = models.BooleanField(default=False)
    # The Docker swarm its engine is in, as last probed: its key ("" for none; null: never reported, an agent older
    # than the report) and whether it is a manager. The scheduler spreads a gang over nodes only within one swarm
    # with a manager (jobs.scheduler.core.fabric).
    swarm = models.CharField(max_length=64, null=True, blank=True, default=None)
    swarm_manager = models.BooleanField(default=False)
    probed_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["state", "last_heartbeat_at"])]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(runtime="simulated") | models.Q(simulated_gpu_count=0),
                name="node_simulated_gpus_only_on_simulated",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def agent_queue(self) -> str:
        """The Celery queue the node's agent consumes; the controller's for simulated nodes."""
        return "control" if self.runtime == RuntimeKind.SIMULATED else agent_queue_for(self.name)

    @property
    def is_simulated(self) -> bool:
        return self.runtime == RuntimeKind.SIMULATED


def agent_queue_for(node_name: str) -> str:
    """Return the Celery queue of the agent of the node named `node_name`."""
    return f"node.{node_name}"


class Gpu(models.Model):
    """One GPU of a node, identified by its UUID. `present` turns False when a probe no longer finds it."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=100, unique=True)
    model = models.CharField(max_length=100)
    memory_mib = models.PositiveIntegerField(default=0)
    mig_mode = models.CharField(max_length=20, choices=MigMode.choices, default=MigMode.UNSUPPORTED)
    present = models.BooleanField(default=True)
    health = models.CharField(max_length=20, choices=GpuHealth.choices, default=GpuHealth.OK)
    health_reason = models.TextField(blank=True, max_length=2000)
    health_changed_at = models.DateTimeField(null=True, blank=True)
    utilization = models.FloatField(null=True, blank=True)
    memory_used_mib = models.PositiveIntegerField(null=True, blank=True)
    last_sample = models.JSONField(null=True, blank=True)
    last_sample_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node__name", "index"]
        indexes = [models.Index(fields=["node", "index"])]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class NodeEvent(models.Model):
    """Something that happened to a node or one of its GPUs, for operators. Dotted kinds (`node.state_changed`)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    gpu = models.ForeignKey(Gpu, on_delete=models.SET_NULL, null=True, blank=True, related_name="events")
    kind = models.CharField(max_length=60)
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20, blank=True)
    message = models.TextField(max_length=4000)
    data = models.JSONField(default=dict, blank=True)
    actor_label = models.CharField(max_length=150, default="system")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["node", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.node_id} {self.kind}"


class GpuMinute(models.Model):
    """One GPU's samples of one UTC minute, rolled up: for charts, idle reclaim and usage accounting.

    Averages are kept as sums and counts, so partial rollups of a minute
    (reports that arrive in different batches) merge exactly. `samples`
    counts samples with a utilization reading; `power_samples` those with a
    power reading (some GPUs report none).
    """

    # No index of its own: the unique (gpu, minute) index leads with it.
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="minutes", db_index=False)
    minute = models.DateTimeField(help_text="Start of the UTC minute.")
    samples = models.PositiveIntegerField()
    utilization_sum = models.FloatField()
    utilization_max = models.FloatField()
    memory_used_max_mib = models.PositiveIntegerField(null=True, blank=True)
    power_samples = models.PositiveIntegerField(default=0)
    power_sum = models.FloatField(default=0.0)
    temperature_max = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["gpu_id", "minute"]
        constraints = [
            # The upsert's conflict target; its index also serves "minutes of these GPUs in this range".
            models.UniqueConstraint(fields=["gpu", "minute"], name="gpu_minute_once"),
            models.CheckConstraint(condition=models.Q(samples__gt=0), name="gpu_minute_has_samples"),
            models.CheckConstraint(
                condition=models.Q(power_samples__lte=models.F("samples")), name="gpu_minute_power_samples_bounded"
            ),
        ]
        # The retention purge deletes the oldest minutes across every GPU.
        indexes = [models.Index(fields=["minute"], name="gpu_minute_minute")]

    def __str__(self) -> str:
        return f"{self.gpu_id}@{self.minute:%Y-%m-%dT%H:%MZ}"

    @property
    def utilization_avg(self) -> float:
        return self.utilization_sum / self.samples

    @property
    def power_avg(self) -> float | None:
        return self.power_sum / self.power_samples if self.power_samples else None


from inventory.models.agents import NodeCredential, NodeJoinToken  # noqa: E402
from inventory.models.storage import StorageBackend, Volume, VolumeShare  # noqa: E402

__all__ = [
    "Gpu",
    "GpuMinute",
    "Node",
    "NodeCredential",
    "NodeEvent",
    "NodeJoinToken",
    "NodePool",
    "StorageBackend",
    "Volume",
    "VolumeShare",
]
