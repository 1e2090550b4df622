"""Workloads (batch jobs and notebook sessions), the GPUs they hold, and what happened to them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from jobs.choices import PRIORITY_VALUES, PriorityClass, WorkloadKind, WorkloadState
from tenants.scoping import TenantOwnedModel

MAX_GPUS_PER_REPLICA = 64
MAX_REPLICAS = 64
# /dev/shm is memory the workload holds (tmpfs pages count against its limit): never more than all of it.
SHM_WITHIN_MEMORY = Q(shm_mib__isnull=True) | Q(shm_mib__lte=F("memory_mib"))


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
    # The size of /dev/shm; null: the runtime's default (Docker's 64 MiB).
    shm_mib = models.PositiveIntegerField(null=True, blank=True)
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

    # Execution (issue 5): the port a workload serves HTTP on inside its sandbox (notebooks: Jupyter's),
    # reached only through the notebook proxy at /notebooks/<id>/ on the notebook origin (NOTEBOOK_ORIGIN).
    service_port = models.PositiveIntegerField(null=True, blank=True)
    preset = models.ForeignKey("jobs.LaunchPreset", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # Notebooks: the secret of the current session's Jupyter server (regenerated for every attempt; never
    # put in a URL or a log). Idle reclaim: the timeout, when the owner was warned, when they extended.
    session_secret = models.CharField(max_length=128, blank=True)
    idle_timeout_seconds = models.PositiveIntegerField(null=True, blank=True)
    idle_warned_at = models.DateTimeField(null=True, blank=True)
    idle_extended_at = models.DateTimeField(null=True, blank=True)
    last_activity_at = models.DateTimeField(null=True, blank=True)
    # When the controller last asked the node to stop this workload (reconcile re-asks after a while).
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # The sequence number of the last stored log line (lines are numbered 1, 2, ... per workload).
    log_seq = models.BigIntegerField(default=0)

    # Storage (issue 16). The signal a stop sends first (then SIGKILL after the grace period), so a training
    # script can checkpoint; when its checkpoint directory last changed (kept across attempts: the next
    # attempt resumes from it); the GPU-seconds of work that preemptions threw away; a notebook's last
    # JupyterLab path, where Resume brings its owner back.
    stop_signal = models.CharField(max_length=10, default="SIGTERM")
    checkpointed_at = models.DateTimeField(null=True, blank=True)
    lost_gpu_seconds = models.FloatField(default=0.0)
    lab_path = models.CharField(max_length=500, blank=True)

    # Time (issue 31). The run time predicted at submission from similar finished work (None: no history yet;
    # `jobs.services.predictions`) and the sentence it rests on; once it ends, its run time (this attempt's plus
    # what earlier ones kept) and the prediction's relative error, (actual - predicted) / predicted. How often it
    # was preempted, and the run seconds its checkpoints kept across those preemptions. While it waits, the
    # scheduler's estimate of its start and the assumption behind it; the GPUs reserved for it from
    # `reserved_from`, as [{"node": name, "gpus": [uuid, ...]}] per replica ([]: none reserved).
    predicted_runtime_seconds = models.PositiveIntegerField(null=True, blank=True)
    prediction_basis = models.CharField(max_length=200, blank=True)
    run_seconds = models.FloatField(null=True, blank=True)
    prediction_error = models.FloatField(null=True, blank=True)
    preemptions = models.PositiveIntegerField(default=0)
    attained_seconds = models.FloatField(default=0.0)
    estimated_start_at = models.DateTimeField(null=True, blank=True)
    estimate_basis = models.TextField(blank=True)
    reserved_from = models.DateTimeField(null=True, blank=True)
    reserved_gpus = models.JSONField(default=list, blank=True)

    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    # A digest of the normalized request: a retried key with another body is refused, not answered.
    request_fingerprint = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["pool", "state"]),
            models.Index(fields=["tenant", "state"]),
            # Submission's count limits: a project's pending work per pool, an owner's unfinished
            # notebooks. Partial, so counting never walks the rest of the backlog or history.
            models.Index(fields=["project", "pool"], condition=Q(state="pending"), name="workload_pending_per_project"),
            models.Index(
                fields=["owner", "pool"],
                condition=Q(kind="notebook", state__in=["pending", "scheduled", "starting", "running", "preempted"]),
                name="workload_live_notebooks",
            ),
            # Run-time predictions read a project's latest succeeded runs of one GPU shape.
            models.Index(
                fields=["project", "gpus_per_replica", "replicas", "-finished_at"],
                condition=Q(state="succeeded", run_seconds__isnull=False),
                name="workload_finished_runs",
            ),
        ]
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
            models.CheckConstraint(condition=SHM_WITHIN_MEMORY, name="workload_shm_within_memory"),
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
        indexes = [
            models.Index(fields=["node"], condition=Q(released_at__isnull=True), name="allocation_active_node"),
            # Usage reports read a tenant's allocations that overlap a period (accounting.selectors):
            # without it a tenant's month scans every allocation the tenant ever held.
            models.Index(fields=["tenant", "released_at"], name="allocation_tenant_released"),
            # The scheduler's decayed usage reads what was held lately: open allocations and recent releases.
            models.Index(fields=["released_at"], name="allocation_released"),
        ]
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
    # A preemption's cost in GPU-seconds, as its message words it: the work it threw away since the last
    # checkpoint, and the restart overhead the victim pays again (None on other events).
    lost_gpu_seconds = models.FloatField(null=True, blank=True)
    overhead_gpu_seconds = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.workload_id}"


class ReplicaState(models.TextChoices):
    """Where one replica of one attempt stands on its node."""

    LAUNCHING = "launching", "Launching"
    RUNNING = "running", "Running"
    EXITED = "exited", "Exited"
    LOST = "lost", "Lost"


class Replica(TenantOwnedModel):
    """One replica of one attempt of a workload as launched on a node: the runtime's handle and what it reported.

    `handle` is the runtime's opaque JSON state (so a restarted controller or
    agent can find the container again); `endpoint` is where the replica
    serves `Workload.service_port` (an http:// base URL the proxy reaches);
    `log_cursor` is the runtime's cursor after the last stored log line, from
    which a restarted log follower resumes; `log_end` is the cursor after the
    last line the agent shipped, as its exit report says ("" until then): a
    replica over with `log_cursor` short of it lost a batch on the way, and
    its output is read again from `log_cursor` (`jobs.services.reconcile`).

    When the node had to pull the image to start it, `pull_started_at` and
    `pull_finished_at` say when (the latter None while it pulls, or when the
    start came before the pull's last report), and `pull_progress` holds the
    latest `PullProgress` the agent reported, as JSON (`image`, `began_at`,
    `seconds`, `layers_done`, `layers_total`, `bytes_done`, `bytes_total`,
    `done`); all stay empty when the image was already there.
    """

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="replica_runs")
    attempt = models.PositiveIntegerField()
    index = models.PositiveSmallIntegerField()
    node = models.ForeignKey("inventory.Node", on_delete=models.PROTECT, related_name="replica_runs")
    name = models.CharField(max_length=200)
    handle = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=ReplicaState.choices, default=ReplicaState.LAUNCHING)
    exit_code = models.IntegerField(null=True, blank=True)
    message = models.TextField(blank=True)
    endpoint = models.CharField(max_length=255, blank=True)
    log_cursor = models.CharField(max_length=100, blank=True)
    log_end = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    pull_started_at = models.DateTimeField(null=True, blank=True)
    pull_finished_at = models.DateTimeField(null=True, blank=True)
    pull_progress = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["workload_id", "attempt", "index"]
        indexes = [models.Index(fields=["node", "state"])]
        constraints = [
            models.UniqueConstraint(fields=["workload", "attempt", "index"], name="replica_unique_per_attempt"),
        ]

    def __str__(self) -> str:
        return self.name


class LogChunk(TenantOwnedModel):
    """Consecutive output lines of a workload, numbered `first_seq`..`last_seq` (per workload, from 1).

    `lines` is a list of `[seq, timestamp, stream, text, attempt, replica]`.
    Chunks are written once and deleted by retention, never edited.
    """

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="log_chunks")
    first_seq = models.BigIntegerField()
    last_seq = models.BigIntegerField()
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()
    lines = models.JSONField(default=list)
    size_bytes = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["workload_id", "first_seq"]
        constraints = [
            models.UniqueConstraint(fields=["workload", "first_seq"], name="log_chunk_unique_start"),
            models.CheckConstraint(condition=Q(last_seq__gte=F("first_seq")), name="log_chunk_seq_order"),
        ]

    def __str__(self) -> str:
        return f"{self.workload_id}:{self.first_seq}-{self.last_seq}"


class AllowedImage(models.Model):
    """An image pattern operators allow: for one tenant, or for every tenant when `tenant` is empty.

    `pattern` is an image reference with shell wildcards (`registry.local/pytorch:*`).
    `notebook` marks images that can serve a Jupyter notebook session.
    """

    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, null=True, blank=True, related_name="allowed_images"
    )
    pattern = models.CharField(max_length=255)
    notebook = models.BooleanField(default=False)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant_id", "pattern"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "pattern"], condition=Q(tenant__isnull=False), name="allowed_image_unique_per_tenant"
            ),
            models.UniqueConstraint(
                fields=["pattern"], condition=Q(tenant__isnull=True), name="allowed_image_unique_global"
            ),
        ]

    def __str__(self) -> str:
        return self.pattern


class LaunchPreset(TenantOwnedModel):
    """A tenant admin's ready-made launch: image, kind, resources and (notebooks) idle timeout."""

    name = models.CharField(max_length=63)
    description = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=16, choices=WorkloadKind.choices, default=WorkloadKind.NOTEBOOK)
    image = models.CharField(max_length=255)
    command = models.JSONField(default=list, blank=True)
    pool = models.ForeignKey("inventory.NodePool", on_delete=models.PROTECT, related_name="presets")
    gpus_per_replica = models.PositiveSmallIntegerField(default=1)
    replicas = models.PositiveSmallIntegerField(default=1)
    cpu_milli = models.PositiveIntegerField(default=1000)
    memory_mib = models.PositiveIntegerField(default=4096)
    shm_mib = models.PositiveIntegerField(null=True, blank=True)
    idle_timeout_seconds = models.PositiveIntegerField(null=True, blank=True)
    max_runtime_seconds = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="launch_preset_unique_name"),
            models.CheckConstraint(condition=SHM_WITHIN_MEMORY, name="launch_preset_shm_within_memory"),
        ]

    def __str__(self) -> str:
        return self.name
