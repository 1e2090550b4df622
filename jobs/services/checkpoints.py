"""Seeing running jobs' checkpoints: when did each last write to its checkpoint directory.

A job finds `GPUCLOUD_CHECKPOINT_DIR` in its environment, on its project's
volume and the same for every attempt. Whatever it writes there is its
checkpoint: the newest modification time of a file in that directory
(at most `MAX_ENTRIES` looked at, no symlink followed) is recorded as
`Workload.checkpointed_at`, with an event, and the scheduler preempts
among equal victims the one that loses the least work since then.

The controller looks where the console reaches the volume (every shared
backend, and a node-local one on the console's own host); a job whose
volume it cannot reach counts as never having checkpointed.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from inventory.services.mounts import checkpoint_host_dirs
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Workload, WorkloadEvent

MAX_ENTRIES = 10_000


def newest_file_time(directory: str, *, max_entries: int = MAX_ENTRIES) -> float | None:
    """Return the newest modification time (epoch seconds) of a regular file below `directory`, or None.

    Symlinks are not followed; at most `max_entries` entries are looked at.
    """
    newest: float | None = None
    stack, seen = [directory], 0
    while stack and seen < max_entries:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                seen += 1
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                    newest = mtime if newest is None else max(newest, mtime)
                if seen >= max_entries:
                    break
    return newest


def scan_checkpoints() -> int:
    """Record the latest checkpoint of every running job whose checkpoint directory changed; return how many moved.

    Idempotent: only a newer time than the recorded one is written (compare-and-swap on the old value).
    """
    moved = 0
    running = list(Workload.all_tenants.filter(kind=WorkloadKind.JOB, state=WorkloadState.RUNNING))
    directories = checkpoint_host_dirs((workload.pk, workload.project_id) for workload in running)
    for workload in running:
        directory = directories.get(workload.pk)
        newest = newest_file_time(directory) if directory is not None else None
        if newest is None:
            continue
        at = datetime.fromtimestamp(newest, tz=UTC)
        if workload.checkpointed_at is not None and at <= workload.checkpointed_at:
            continue
        updated = Workload.all_tenants.filter(pk=workload.pk, checkpointed_at=workload.checkpointed_at).update(
            checkpointed_at=at
        )
        if updated:
            moved += 1
            WorkloadEvent.all_tenants.create(
                tenant_id=workload.tenant_id,
                workload=workload,
                kind="workload.checkpoint",
                message=f"Checkpoint seen in its checkpoint directory (written {at:%H:%M:%S} UTC).",
            )
    return moved
