"""Workload kinds, states with their transition table, priority classes and reason codes."""

from __future__ import annotations

from django.db import models

from common.transitions import Transitions
from jobs.scheduler.core import Reason


class WorkloadKind(models.TextChoices):
    """A batch job runs to completion; a notebook is an interactive Jupyter session."""

    JOB = "job", "Batch job"
    NOTEBOOK = "notebook", "Notebook"


class WorkloadState(models.TextChoices):
    PENDING = "pending", "Pending"
    SCHEDULED = "scheduled", "Scheduled"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    PREEMPTED = "preempted", "Preempted"
    LOST = "lost", "Lost"
    # A notebook stopped by its owner, by idle reclaim or by preemption: it holds no GPU, its volumes keep
    # its files, and Resume queues it again with the same settings.
    HIBERNATED = "hibernated", "Hibernated"


S = WorkloadState

# States in which a workload holds its allocations.
ACTIVE_STATES: frozenset[WorkloadState] = frozenset({S.SCHEDULED, S.STARTING, S.RUNNING})
TERMINAL_STATES: frozenset[WorkloadState] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.LOST})

# The lifecycle. A preempted batch job goes back to pending (a new attempt); a
# preempted notebook, once stopped, hibernates until its owner resumes or cancels it.
WORKLOAD_TRANSITIONS: Transitions[WorkloadState] = Transitions(
    "workload",
    WorkloadState,
    {
        S.PENDING: frozenset({S.SCHEDULED, S.CANCELLED}),
        S.SCHEDULED: frozenset({S.STARTING, S.PENDING, S.PREEMPTED, S.CANCELLED, S.FAILED, S.LOST, S.HIBERNATED}),
        # A replica can exit before its start report is processed: starting may go straight to succeeded.
        S.STARTING: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PREEMPTED, S.LOST, S.HIBERNATED}),
        S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PREEMPTED, S.LOST, S.HIBERNATED}),
        # Preempted (or its node lost) and still stopping: it may also fail or be cancelled before it settles.
        S.PREEMPTED: frozenset({S.PENDING, S.CANCELLED, S.HIBERNATED}),
        # Resume is a new attempt in the queue; cancelling ends it for good (its volumes stay).
        S.HIBERNATED: frozenset({S.PENDING, S.CANCELLED}),
        # Ended workloads move only by an explicit restart: a new attempt, back in the queue.
        S.SUCCEEDED: frozenset({S.PENDING}),
        S.FAILED: frozenset({S.PENDING}),
        S.CANCELLED: frozenset({S.PENDING}),
        S.LOST: frozenset({S.PENDING}),
    },
)


class PriorityClass(models.TextChoices):
    """Priority inside a project: high preempts low; across projects fair share decides first."""

    LOW = "low", "Low"
    NORMAL = "normal", "Normal"
    HIGH = "high", "High"


PRIORITY_VALUES: dict[str, int] = {PriorityClass.LOW: 0, PriorityClass.NORMAL: 50, PriorityClass.HIGH: 100}


class ReasonCode(models.TextChoices):
    """Why a workload waits, ended or was stopped.

    The scheduler's codes are the pure core's `Reason` values (the core is
    pure, so importing it here costs nothing); the rest are written by the
    services. A test keeps the two lists in step.
    """

    QUOTA_LIMIT = Reason.QUOTA_LIMIT.value, "Quota limit reached"
    NO_CAPACITY_FOR_MODEL = Reason.NO_CAPACITY_FOR_MODEL.value, "No capacity of the requested GPU model"
    GANG_CANNOT_FIT = Reason.GANG_CANNOT_FIT.value, "The gang cannot fit"
    NO_CAPACITY = Reason.NO_CAPACITY.value, "No free capacity"
    POOL_CORDONED = Reason.POOL_CORDONED.value, "Pool cordoned"
    UNKNOWN_POOL = Reason.UNKNOWN_POOL.value, "Unknown pool"
    DEDICATED_POOL = Reason.DEDICATED_POOL.value, "Pool dedicated to another tenant"
    NO_STORAGE = Reason.NO_STORAGE.value, "No node can mount its volumes"
    BUDGET = Reason.BUDGET.value, "Budget used up"
    WAITING_FOR_FAIRER_WORK = Reason.WAITING_FOR_FAIRER_WORK.value, "Waiting behind fairer work"
    WAITING_FOR_HIGHER_PRIORITY = Reason.WAITING_FOR_HIGHER_PRIORITY.value, "Waiting behind higher-priority work"
    BEHIND_QUEUE_HEAD = Reason.BEHIND_QUEUE_HEAD.value, "Behind the head of the queue"
    RECLAIM_GUARANTEE = Reason.RECLAIM_GUARANTEE.value, "Reclaimed for a guarantee"
    PRIORITY = Reason.PRIORITY.value, "Preempted by higher priority"
    CANCELLED_BY_USER = "CANCELLED_BY_USER", "Cancelled by a user"
    PREEMPTED = "PREEMPTED", "Preempted"
    STOPPED_BY_USER = "STOPPED_BY_USER", "Stopped by a user"
    RESTARTED = "RESTARTED", "Restarted by a user"
    EXITED = "EXITED", "Exited"
    EXIT_NONZERO = "EXIT_NONZERO", "Exited with an error"
    LAUNCH_FAILED = "LAUNCH_FAILED", "Launch failed"
    START_TIMEOUT = "START_TIMEOUT", "Did not start in time"
    MAX_RUNTIME = "MAX_RUNTIME", "Maximum runtime reached"
    NODE_LOST = "NODE_LOST", "Node lost"
    IDLE = "IDLE", "Idle notebook stopped"
    CONTAINER_VANISHED = "CONTAINER_VANISHED", "Container vanished"
    GANG_MEMBER_FAILED = "GANG_MEMBER_FAILED", "Another replica of the gang failed"
    ENGINE_LOST_RUN = "ENGINE_LOST_RUN", "The node's container engine lost track of it"
    HIBERNATED_BY_USER = "HIBERNATED_BY_USER", "Hibernated by a user"
    RESUMED = "RESUMED", "Resumed by a user"
    ACCESS_REVOKED = "ACCESS_REVOKED", "Stopped: its owner lost access"


class WorkloadEventKind(models.TextChoices):
    """The kinds of `WorkloadEvent`, with their labels for people (the timeline shows the label, the kind in
    its title). A test finds every kind the code writes and holds it to having one here."""

    SUBMITTED = "workload.submitted", "Submitted"
    STATE_CHANGED = "workload.state_changed", "State changed"
    IMAGE_PULLED = "workload.image_pulled", "Image pulled"
    CHECKPOINT = "workload.checkpoint", "Checkpoint saved"
    IDLE_WARNING = "workload.idle_warning", "Idle warning"
    IDLE_WARNING_CLEARED = "workload.idle_warning_cleared", "Idle warning called off"
    IDLE_EXTENDED = "workload.idle_extended", "Idle timeout extended"


def event_kind_label(kind: str) -> str:
    """Return the label of a workload event kind ('workload.image_pulled' -> 'Image pulled'); an unknown kind
    is returned as it is."""
    try:
        return str(WorkloadEventKind(kind).label)
    except ValueError:
        return kind
