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
    Gpu,
    Node,
    Ordering,
    PlacementPolicy,
    Pool,
    Preemption,
    ProjectQuota,
    Reason,
    ReplicaAllocation,
    SchedulerConfig,
    Snapshot,
    TenantQuota,
    Waiting,
    Workload,
    WorkloadKind,
    last_saved_at,
    lost_work,
)

__all__ = [
    "BudgetAction",
    "BudgetState",
    "Decisions",
    "Gpu",
    "Node",
    "Ordering",
    "PlacementPolicy",
    "Pool",
    "Preemption",
    "ProjectQuota",
    "Reason",
    "ReplicaAllocation",
    "SchedulerConfig",
    "Snapshot",
    "TenantQuota",
    "Waiting",
    "Workload",
    "WorkloadKind",
    "last_saved_at",
    "lost_work",
    "schedule",
]
