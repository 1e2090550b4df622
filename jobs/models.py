"""Workloads (batch jobs and notebook sessions), the GPUs they hold, and what happened to them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from jobs.choices import PRIORITY_VALUES, PriorityClass, WorkloadKind, WorkloadState
from tenants.scoping import TenantOwnedModel

MAX_GPUS_PER_REPLICA = 64
MAX_REPLICAS = 64


class Workload(TenantOwnedModel):
    """A batch job or notebook: a gang of `replicas` replicas of `gpus_per_replica` GPUs each, in one pool.

    `state`, `reason_*` and `queue_position` are written by the scheduler;
    `attempt` grows each time the workload is requeued. `submitted_at` is
    kept across attempts, so a requeued job keeps its place in order.
    """

    project = models.ForeignKey("tenants.Project", on_delete=models.PROTECT, related_name="workloads")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="workloads")
    kind = models.CharField(max_length=16, choices=WorkloadKind.choices, default=WorkloadKind.JOB)
    name = models.CharField(max_length=63)
    image = models.CharField(max_length=255)
    command = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    gpus_per_replica = models.PositiveSmallIntegerField(default=1)
    replicas = models.PositiveSmallIntegerField(default=1)
    gpu_models = models.JSONField(default=list, blank=True)
    pool = models.ForeignKey("inventory.NodePool", on_delete=models.PROTECT, related_name="workloads")
    cpu_milli = models.PositiveIntegerField(default=1000)
    memory_mib = models.PositiveIntegerField(default=4096)
    priority_class = models.CharField(max_length=16, choices=PriorityClass.choices, default=PriorityClass.NORMAL)
    max_runtime_seconds = models.PositiveIntegerField(null=True, blank=True)
    requeue_limit = models.PositiveSmallIntegerField(default=3)
    attempt = models.PositiveIntegerField(default=1)

    state = models.CharField(max_length=16, choices=WorkloadState.choices, default=WorkloadState.PENDING, db_index=True)
    reason_code = models.CharField(max_length=40, blank=True)
    reason_message = models.TextField(blank=True)
    reason_hint = models.TextField(blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)

    submitted_at = models.DateTimeField(default=timezone.now, db_index=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    # A digest of the normalized request: a retried key with another body is refused, not answered.
    request_fingerprint = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [models.Index(fields=["pool", "state"]), models.Index(fields=["tenant", "state"])]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "owner", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="workload_idempotency_key_unique",
            ),
            models.CheckConstraint(
                condition=Q(gpus_per_replica__lte=MAX_GPUS_PER_REPLICA), name="workload_gpus_per_replica_max"
            ),
            models.CheckConstraint(
                condition=Q(replicas__gte=1, replicas__lte=MAX_REPLICAS), name="workload_replicas_range"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.pk}"

    @property
    def priority(self) -> int:
        """The priority class as the scheduler's number (higher preempts lower in a project)."""
        return PRIORITY_VALUES[self.priority_class]

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas


class Allocation(TenantOwnedModel):
    """One GPU (or, for a CPU-only replica, one node) held by one replica of a workload until `released_at`."""

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="allocations")
    replica = models.PositiveSmallIntegerField()
    node = models.ForeignKey("inventory.Node", on_delete=models.PROTECT, related_name="allocations")
    gpu = models.ForeignKey(
        "inventory.Gpu", on_delete=models.PROTECT, null=True, blank=True, related_name="allocations"
    )
    created_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["workload_id", "replica", "id"]
        indexes = [models.Index(fields=["node"], condition=Q(released_at__isnull=True), name="allocation_active_node")]
        constraints = [
            # A GPU is never in two active allocations: the database refuses it, whatever the code does.
            models.UniqueConstraint(
                fields=["gpu"], condition=Q(released_at__isnull=True), name="one_active_allocation_per_gpu"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workload_id}/{self.replica} on {self.node_id}:{self.gpu_id}"


class WorkloadEvent(TenantOwnedModel):
    """Something that happened to a workload, for its owner: dotted kinds (`workload.state_changed`)."""

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=60)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    reason_code = models.CharField(max_length=40, blank=True)
    message = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.workload_id}"
