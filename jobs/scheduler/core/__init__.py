"""The pure scheduling core: a frozen `Snapshot` in, frozen `Decisions` out.

It imports no Django, no driver and no other app, reads no clock and draws no
random numbers, so a pass is reproducible from its snapshot (an import
contract and a test enforce it). `schedule` is the one entry point.
"""

from jobs.scheduler.core.engine import schedule
from jobs.scheduler.core.model import (
    BudgetAction,
    BudgetState,
    Decisions,
    Estimate,
    Gpu,
    Node,
    Ordering,
    OwnerUsage,
    PlacementPolicy,
    Pool,
    Preemption,
    ProjectQuota,
    Reason,
    ReplicaAllocation,
    Reservation,
    SchedulerConfig,
    SlurmWeights,
    Snapshot,
    TenantQuota,
    Waiting,
    Workload,
    WorkloadKind,
    last_saved_at,
    lost_work,
    planned_run_s,
)

__all__ = [
    "BudgetAction",
    "BudgetState",
    "Decisions",
    "Estimate",
    "Gpu",
    "Node",
    "Ordering",
    "OwnerUsage",
    "PlacementPolicy",
    "Pool",
    "Preemption",
    "ProjectQuota",
    "Reason",
    "ReplicaAllocation",
    "Reservation",
    "SchedulerConfig",
    "SlurmWeights",
    "Snapshot",
    "TenantQuota",
    "Waiting",
    "Workload",
    "WorkloadKind",
    "last_saved_at",
    "lost_work",
    "planned_run_s",
    "schedule",
]
