"""Recording running jobs' checkpoints: when did each last write to its checkpoint directory.

A job finds `GPUCLOUD_CHECKPOINT_DIR` in its environment, on its project's
volume and the same for every attempt. Whatever it writes there is its
checkpoint. The agent of the node that runs the job's first replica looks at
that directory on its own disk (`inventory.agent.checkpoints`) and reports
the newest file time; `record_checkpoint` keeps it as
`Workload.checkpointed_at`, with an event, and the scheduler preempts among
equal victims the one that loses the least work since then.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import transaction

from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Replica, ReplicaState, Workload, WorkloadEvent


@transaction.atomic
def record_checkpoint(*, workload_id: int, attempt: int, replica: int, at: float) -> bool:
    """Record that the running job last wrote a checkpoint at `at` (epoch seconds); return whether it moved.

    Idempotent and order-proof: only a time newer than the recorded one is
    written (compare-and-swap on the old value). Ignored when the report is
    not about the job's current attempt, a replica of it that runs, or a
    running job, or when `at` lies in the future (a node's clock ahead of the
    console's is no checkpoint yet).
    """
    written = datetime.fromtimestamp(at, tz=UTC)
    job = Workload.all_tenants.filter(
        pk=workload_id, kind=WorkloadKind.JOB, state=WorkloadState.RUNNING, attempt=attempt
    ).first()
    if job is None or written > datetime.now(tz=UTC):
        return False
    reported_by_running = Replica.all_tenants.filter(
        workload_id=workload_id, attempt=attempt, index=replica, state=ReplicaState.RUNNING
    ).exists()
    if not reported_by_running or (job.checkpointed_at is not None and written <= job.checkpointed_at):
        return False
    moved = Workload.all_tenants.filter(pk=job.pk, checkpointed_at=job.checkpointed_at).update(checkpointed_at=written)
    if moved:
        WorkloadEvent.all_tenants.create(
            tenant_id=job.tenant_id,
            workload=job,
            kind="workload.checkpoint",
            message=f"Checkpoint seen in its checkpoint directory (written {written:%H:%M:%S} UTC).",
        )
    return bool(moved)
