"""What a scheduling pass reads and what it decides: frozen dataclasses and small enums.

Everything here is immutable and holds only plain values, so a snapshot can be
logged, replayed and compared; the same snapshot always yields the same
decisions.

`lost_work` is the one definition of what a preemption costs: the GPU-seconds
of progress since the victim's last checkpoint in its current attempt (since
its start when it has none). Reclaim orders victims by it and reports it on
each `Preemption`; the simulator charges it to the preempted job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class PlacementPolicy(StrEnum):
    """How a pool chooses among nodes that fit: pack tightly or spread out."""

    BINPACK = "binpack"
    SPREAD = "spread"


class Ordering(StrEnum):
    """The policy of a pass: ours (`fairshare`), or one of the baselines a user would pick instead.

    - `fifo`: strict FIFO, stops at the first workload that does not start;
    - `backfill`: FIFO order, a workload that does not fit is skipped (greedy backfill, no reservation);
    - `slurm`: Slurm's multifactor priority (age, job size, fair share with decayed usage) and EASY
      backfill on the workloads' time limits with a reservation for the top blocked workload of each pool;
    - `fairshare`: hierarchical fair share with decayed usage, shortest predicted work first inside a
      project, a reservation for the most urgent blocked workload, and cost-aware reclaim.

    Only `fairshare` preempts.
    """

    FAIRSHARE = "fairshare"
    FIFO = "fifo"
    BACKFILL = "backfill"
    SLURM = "slurm"


class WorkloadKind(StrEnum):
    """A batch job or an interactive notebook (notebooks within their guarantee are never preempted)."""

    JOB = "job"
    NOTEBOOK = "notebook"


class Reason(StrEnum):
    """Why a workload keeps waiting, or why a running one is preempted."""

    QUOTA_LIMIT = "QUOTA_LIMIT"
    NO_CAPACITY_FOR_MODEL = "NO_CAPACITY_FOR_MODEL"
    GANG_CANNOT_FIT = "GANG_CANNOT_FIT"
    NO_CAPACITY = "NO_CAPACITY"
    POOL_CORDONED = "POOL_CORDONED"
    UNKNOWN_POOL = "UNKNOWN_POOL"
    DEDICATED_POOL = "DEDICATED_POOL"
    WAITING_FOR_FAIRER_WORK = "WAITING_FOR_FAIRER_WORK"
    WAITING_FOR_HIGHER_PRIORITY = "WAITING_FOR_HIGHER_PRIORITY"
    BEHIND_QUEUE_HEAD = "BEHIND_QUEUE_HEAD"
    NO_STORAGE = "NO_STORAGE"
    # Its owner's budget is used up (waiting), or its owner's budget stops running work (preemption).
    BUDGET = "BUDGET"
    # Preemption reasons.
    RECLAIM_GUARANTEE = "RECLAIM_GUARANTEE"
    PRIORITY = "PRIORITY"


class BudgetAction(StrEnum):
    """What an exhausted budget does; each action includes the ones before it (the core enforces the last two)."""

    NOTIFY_ONLY = "notify_only"
    REFUSE_NEW = "refuse_new"
    STOP_BORROWING = "stop_borrowing"
    STOP_RUNNING = "stop_running"


@dataclass(frozen=True, slots=True)
class Pool:
    """A node pool: its placement policy, an optional tenant it is dedicated to, and whether it is cordoned."""

    name: str
    policy: PlacementPolicy = PlacementPolicy.BINPACK
    dedicated_tenant: str | None = None
    cordoned: bool = False


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU of a node. `free` is false when it is allocated; `healthy` false when it failed."""

    uuid: str
    index: int
    model: str
    healthy: bool = True
    free: bool = True


@dataclass(frozen=True, slots=True)
class Node:
    """A node with its capacity and what is free on it now (the caller has already subtracted running work)."""

    name: str
    pool: str
    cpu_milli: int
    memory_mib: int
    cpu_free_milli: int
    memory_free_mib: int
    gpus: tuple[Gpu, ...] = ()
    # False for cordoned, draining or unhealthy nodes: nothing new lands on them.
    schedulable: bool = True
    # Storage backends whose volumes it can mount; None: any (simulated and legacy nodes).
    storage: frozenset[str] | None = None
    # Which nodes a gang's replicas may share with this one (core.fabric): None for any (a runtime whose gangs need
    # no network of their own), "" for none (a Docker engine in no swarm), else its Docker swarm's key; and whether
    # the node is a manager of that swarm (only a manager makes a gang's overlay network).
    fabric: str | None = None
    fabric_manager: bool = False


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """A tenant's quota in one pool, in GPUs: always `guaranteed`, at most `limit`, idle capacity by `weight`."""

    tenant: str
    pool: str
    guaranteed: int
    limit: int
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class ProjectQuota:
    """A project's quota in one pool, carved out of its tenant's."""

    project: str
    tenant: str
    pool: str
    guaranteed: int
    limit: int
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A budget's use in its current period, as the caller measured it: a tenant's own (`project` None) or a
    project's. `unit` and `period` only word the sentences ("GPU-hours", "this month")."""

    tenant: str
    project: str | None
    action: BudgetAction
    used: float
    amount: float
    unit: str = "GPU-hours"
    period: str = "this month"

    @property
    def exhausted(self) -> bool:
        """Return whether the budget is used up: its hard action applies."""
        return self.used >= self.amount


@dataclass(frozen=True, slots=True)
class ReplicaAllocation:
    """Where one replica of a gang runs: a node and the GPUs it holds there (none for a CPU-only workload)."""

    node: str
    gpu_uuids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Workload:
    """A batch job or notebook; a gang of `replicas` replicas, each needing `gpus` GPUs, CPU and memory.

    `models` lists acceptable GPU models (empty: any). `storage` names the
    storage backends of the volumes it mounts: it goes only to nodes that can
    mount all of them. Pending workloads have no `allocation`; running ones
    hold one `ReplicaAllocation` per replica and a `started_at`, and
    `checkpointed_at` is the time of their latest checkpoint in this attempt
    (None: none yet), on the same clock as `started_at` and `Snapshot.now`.
    """

    id: str
    tenant: str
    project: str
    pool: str
    submitted_at: float
    gpus: int = 1
    replicas: int = 1
    kind: WorkloadKind = WorkloadKind.JOB
    priority: int = 0
    models: frozenset[str] = frozenset()
    cpu_milli: int = 0
    memory_mib: int = 0
    started_at: float | None = None
    allocation: tuple[ReplicaAllocation, ...] = ()
    storage: frozenset[str] = frozenset()
    checkpointed_at: float | None = None
    # Time: `limit_s` is the effective limit of one attempt's run time in seconds (its own, else its preset's,
    # project's or pool's maximum; None: none), enforced by killing it. `predicted_s` is the run time predicted
    # from similar past work (None: no history). `attained_s` is the run time it already had in earlier attempts
    # and kept (saved by checkpoints); `preemptions` how often it was preempted so far.
    limit_s: float | None = None
    predicted_s: float | None = None
    attained_s: float = 0.0
    preemptions: int = 0

    @property
    def total_gpus(self) -> int:
        """Return the GPUs the whole gang holds or asks for."""
        return self.gpus * self.replicas


def planned_run_s(workload: Workload) -> float | None:
    """Return the run time a plan should expect from a workload's start: its prediction, capped by its limit.

    The prediction minus what earlier attempts kept, never above the limit
    (it is killed there); the limit alone without a prediction; None with
    neither.
    """
    limit, predicted = workload.limit_s, workload.predicted_s
    if predicted is None:
        return limit
    left = max(predicted - workload.attained_s, 0.0)
    return left if limit is None else min(left, limit)


def last_saved_at(workload: Workload) -> float | None:
    """Return when a running workload's progress was last saved: its latest checkpoint of this attempt, else its start.

    A checkpoint older than the start belongs to an earlier attempt and is
    ignored; None for a workload that is not running.
    """
    started, checkpointed = workload.started_at, workload.checkpointed_at
    if started is None or checkpointed is None or checkpointed < started:
        return started
    return checkpointed


def lost_work(workload: Workload, now: float) -> float:
    """Return the GPU-seconds a preemption at `now` throws away: total GPUs x (now - last save), never negative."""
    saved = last_saved_at(workload)
    if saved is None:
        return 0.0
    return workload.total_gpus * max(0.0, now - saved)


@dataclass(frozen=True, slots=True)
class OwnerUsage:
    """An owner's decayed historical usage in a pool, in GPU-seconds, as the caller measured it at `Snapshot.now`.

    `project` None for the tenant's own total. Each past GPU-second counts
    2^(-age / half-life): the half-life is the pool's (Slurm's
    PriorityDecayHalfLife), applied by the caller.
    """

    pool: str
    tenant: str
    project: str | None
    gpu_seconds: float


@dataclass(frozen=True, slots=True)
class SlurmWeights:
    """The `slurm` baseline's multifactor priority (Slurm's PriorityWeight* and PriorityMaxAge).

    Each factor is in [0, 1]; the priority is their weighted sum. Defaults
    are the weights commonly set on GPU clusters (fair share weighs most,
    then age, then size), and PriorityFavorSmall=YES.
    """

    age: float = 1000.0
    fairshare: float = 10000.0
    job_size: float = 1000.0
    max_age_s: float = 7 * 86400.0
    favor_small: bool = True


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Knobs of a pass. `min_runtime_s`: a workload younger than this is never preempted."""

    ordering: Ordering = Ordering.FAIRSHARE
    min_runtime_s: float = 600.0
    preemption: bool = True
    # Among equal victims, prefer the one whose progress was saved last (the least work lost); off: the newest.
    checkpoint_aware: bool = True
    # The simulator turns explanations off: it needs decisions, not sentences, thousands of times.
    explain: bool = True
    # A workload preempted this often is protected from further preemption.
    max_preemptions: int = 3
    # Run time a preempted workload pays again when it restarts: part of what a preemption costs.
    restart_overhead_s: float = 60.0
    # How much decayed historical usage weighs in the fair-share rank against what an owner holds now.
    history_weight: float = 1.0
    # A reservation for the top blocked workload of each pool (EASY backfill); off: greedy backfill only.
    reservations: bool = True
    # Under fairshare, a workload waiting longer than this gets the pool's reservation before any other.
    starvation_s: float = 6 * 3600.0
    # Under fairshare, work planned to take at most this many GPU-seconds is tried first, shortest first (0: off).
    express_gpu_s: float = 2 * 3600.0
    # Start-time estimates for every waiting workload (the simulator turns them off when it does not measure them).
    estimates: bool = True
    slurm: SlurmWeights = field(default_factory=SlurmWeights)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a pass reads. `now` comes from the caller: the core has no clock."""

    now: float
    pools: tuple[Pool, ...]
    nodes: tuple[Node, ...]
    tenant_quotas: tuple[TenantQuota, ...]
    project_quotas: tuple[ProjectQuota, ...] = ()
    running: tuple[Workload, ...] = ()
    pending: tuple[Workload, ...] = ()
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Budgets in force in their current period; those used up with a hard action of stop_borrowing or
    # stop_running hold their owner's work back (`budgets.py`).
    budgets: tuple[BudgetState, ...] = ()
    # Decayed historical usage per owner and pool (absent: none).
    usage: tuple[OwnerUsage, ...] = ()


@dataclass(frozen=True, slots=True)
class Preemption:
    """A running workload to stop, why, for which pending workload ("" for none: a budget stops it), the
    GPU-seconds of progress it loses, and for a budget the sentence that names it (`detail`)."""

    victim: str
    reason: Reason
    for_workload: str
    lost_gpu_seconds: float = 0.0
    detail: str = ""
    # GPU-seconds of restart overhead the victim pays again (GPUs x `SchedulerConfig.restart_overhead_s`).
    overhead_gpu_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why a workload keeps waiting: a code, a sentence for its owner, its 1-based position in its pool, a hint."""

    reason: Reason
    message: str
    position: int
    hint: str | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """GPUs held from `start_at` for a blocked workload: work that would still run then may not take them."""

    workload: str
    pool: str
    start_at: float
    allocation: tuple[ReplicaAllocation, ...]


@dataclass(frozen=True, slots=True)
class Estimate:
    """When a waiting workload is expected to start, and the assumption it rests on (`basis`, a sentence)."""

    start_at: float
    basis: str


@dataclass(frozen=True, slots=True)
class Decisions:
    """What a pass decided. `fair_shares` maps (pool, tenant) to the GPUs that tenant is entitled to now."""

    placements: Mapping[str, tuple[ReplicaAllocation, ...]]
    preemptions: tuple[Preemption, ...]
    waiting: Mapping[str, Waiting]
    fair_shares: Mapping[tuple[str, str], float]
    reservations: tuple[Reservation, ...] = ()
    # Per waiting workload id (none for a workload that can never start as things stand).
    estimates: Mapping[str, Estimate] = field(default_factory=dict)
