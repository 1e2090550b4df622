"""The scheduler's snapshot: the ledger read in a fixed number of set-based queries, whatever its size.

`build_snapshot` returns the pure core's `Snapshot` and a `Ledger` of the
ids and current values the commit needs (`jobs.scheduler.commit`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from inventory.choices import GpuHealth, NodeState, RuntimeKind, StorageKind
from inventory.models import Gpu, Node, NodePool, StorageBackend
from inventory.services.mounts import storage_needs
from inventory.services.storage import DEFAULT_BACKEND_NAME, mountable_backends
from jobs.accounting_port import accounting
from jobs.choices import ACTIVE_STATES, PRIORITY_VALUES, WorkloadState
from jobs.models import Allocation, Workload
from jobs.scheduler import core
from tenants.models import ProjectQuota, TenantQuota

# One row of a `.values()` query: read-only, keyed by field name.
Row = Mapping[str, Any]

# GPUs that failed or vanished are never offered to the scheduler; degraded ones still are.
_UNUSABLE_HEALTH = {GpuHealth.FAILED}
# Nodes that never served or never will again: not part of the snapshot at all.
_NOT_IN_SERVICE = [NodeState.REGISTERED, NodeState.PROVISIONING, NodeState.FAILED, NodeState.RETIRED]


@dataclass(frozen=True)
class _NodeRef:
    """The two facts `mountable_backends` reads from a node."""

    pk: int
    pool_id: int


@dataclass
class Ledger:
    """What the snapshot was built from, kept to commit the decisions: ids and current values by workload."""

    workloads: dict[str, Row] = field(default_factory=dict)
    node_ids: dict[str, int] = field(default_factory=dict)
    gpu_ids: dict[str, int] = field(default_factory=dict)


def build_snapshot(*, now: datetime, config: core.SchedulerConfig) -> tuple[core.Snapshot, Ledger]:
    """Return the snapshot of the ledger at `now`, and the ids the commit needs.

    Seven queries, two more for the storage backends, three more for
    where pending work's volumes are when there is pending work, one
    for the budgets the core enforces (one more per period in use when
    there are some), and up to four for the decayed usage (none when no pool
    keeps history): both asked of accounting through `jobs.accounting_port`.

    Each workload's time: `limit_s` is its own maximum runtime (set at
    submission from its spec, preset or quota), else its project's, else its
    tenant's quota maximum in its pool; `predicted_s` the prediction stored
    at submission (`jobs.services.predictions`); `attained_s` and
    `preemptions` as its row keeps them.
    """
    ledger = Ledger()
    pools = list(
        NodePool.objects.values("id", "name", "placement_policy", "dedicated_tenant__slug", "usage_half_life_seconds")
    )
    pool_names = {pool["id"]: pool["name"] for pool in pools}
    quotas = _Quotas.read(pool_names)
    workloads = _workload_rows()
    allocations = _active_allocations()
    nodes = _nodes(pool_names, workloads, allocations, ledger)
    with_nodes = {node.pool for node in nodes}
    in_service = {node.pool for node in nodes if node.schedulable}
    pending, running = _workloads(workloads, allocations, pool_names, quotas, ledger)
    snapshot = core.Snapshot(
        now=now.timestamp(),
        pools=tuple(_pool(pool, with_nodes, in_service) for pool in pools),
        nodes=tuple(nodes),
        tenant_quotas=quotas.tenants,
        project_quotas=quotas.projects,
        running=tuple(running),
        pending=tuple(pending),
        config=config,
        budgets=_budgets(now),
        usage=_usage(now, pools, quotas, workloads),
    )
    return snapshot, ledger


def _usage(now: datetime, pools: Sequence[Row], quotas: _Quotas, workloads: list[Row]) -> tuple[core.OwnerUsage, ...]:
    """Return each owner's decayed usage per pool: its projects' and, summed, the tenant's own (`project` None).

    Owners are named from the quotas and the workloads already read; one with
    neither holds nothing and asks for nothing, so the core needs none of its history.
    """
    half_lives = {pool["id"]: pool["usage_half_life_seconds"] for pool in pools}
    found = accounting().decayed_gpu_seconds(now=now, half_lives=half_lives)
    tenants = {**quotas.tenant_slugs, **{row["tenant_id"]: row["tenant__slug"] for row in workloads}}
    projects = {**quotas.project_slugs, **{row["project_id"]: row["project__slug"] for row in workloads}}
    pool_names = {pool["id"]: pool["name"] for pool in pools}
    by_tenant: dict[tuple[str, str], float] = defaultdict(float)
    usage = []
    for (pool_id, tenant_id, project_id), seconds in sorted(found.items()):
        if tenant_id not in tenants or project_id not in projects:
            continue
        pool, tenant = pool_names[pool_id], tenants[tenant_id]
        usage.append(core.OwnerUsage(pool, tenant, projects[project_id], seconds))
        by_tenant[pool, tenant] += seconds
    usage += [core.OwnerUsage(pool, tenant, None, seconds) for (pool, tenant), seconds in sorted(by_tenant.items())]
    return tuple(usage)


def _budgets(now: datetime) -> tuple[core.BudgetState, ...]:
    """Return the budgets in force whose hard action the core enforces, with what their owners used."""
    return accounting().enforced_budgets(now=now)


def _pool(row: Row, with_nodes: set[str], in_service: set[str]) -> core.Pool:
    # A pool whose every node is out of service (cordoned, draining, ...) is reported as cordoned.
    return core.Pool(
        name=row["name"],
        policy=core.PlacementPolicy(row["placement_policy"]),
        dedicated_tenant=row["dedicated_tenant__slug"],
        cordoned=row["name"] in with_nodes and row["name"] not in in_service,
    )


# A workload's time as the core reads it, and the estimate and reservation the commit compares against.
_TIME_FIELDS: tuple[str, ...] = ("max_runtime_seconds", "predicted_runtime_seconds", "attained_seconds", "preemptions")
_TIME_FIELDS += ("estimated_start_at", "estimate_basis", "reserved_from", "reserved_gpus")


def _workload_rows() -> list[Row]:
    states = [WorkloadState.PENDING, *ACTIVE_STATES]
    return list(
        Workload.all_tenants.filter(state__in=states)
        .order_by("id")
        .values(
            "id",
            "tenant_id",
            "tenant__slug",
            "owner_id",
            "project_id",
            "project__slug",
            "pool_id",
            "kind",
            "state",
            "priority_class",
            "gpus_per_replica",
            "replicas",
            "gpu_models",
            "cpu_milli",
            "memory_mib",
            "submitted_at",
            "started_at",
            "scheduled_at",
            "reason_code",
            "reason_message",
            "reason_hint",
            "queue_position",
            "checkpointed_at",
            *_TIME_FIELDS,
        )
    )


def _active_allocations() -> list[Row]:
    return list(
        Allocation.all_tenants.filter(released_at__isnull=True)
        .order_by("workload_id", "replica", "id")
        .values("workload_id", "replica", "node_id", "gpu_id", "gpu__uuid")
    )


def _nodes(
    pool_names: dict[int, str],
    workloads: list[Row],
    allocations: list[Row],
    ledger: Ledger,
) -> list[core.Node]:
    """Return every node in service with what is free on it: GPUs not held, CPU and memory not reserved."""
    rows = list(
        Node.objects.exclude(state__in=_NOT_IN_SERVICE)
        .order_by("name")
        .values("id", "name", "pool_id", "state", "cpu_cores", "memory_mib", "runtime", "swarm", "swarm_manager")
    )
    backends = list(StorageBackend.objects.order_by("name"))
    if not any(backend.is_default for backend in backends):
        # Made on first use (the first launch): until then every node can mount it, as it will.
        backends.append(StorageBackend(name=DEFAULT_BACKEND_NAME, kind=StorageKind.SHARED, is_default=True))
    pools_of: dict[int, set[int]] = defaultdict(set)
    for backend_id, pool_id in StorageBackend.pools.through.objects.values_list("storagebackend_id", "nodepool_id"):
        pools_of[backend_id].add(pool_id)
    gpus_by_node: dict[int, list[Row]] = defaultdict(list)
    for found in (
        Gpu.objects.filter(node_id__in=[row["id"] for row in rows])
        .order_by("node_id", "index")
        .values("id", "node_id", "uuid", "index", "model", "health", "present")
    ):
        gpus_by_node[found["node_id"]].append(found)
    held = {allocation["gpu_id"] for allocation in allocations if allocation["gpu_id"] is not None}
    cpu_used, memory_used = _reserved(workloads, allocations)
    nodes = []
    for row in rows:
        ledger.node_ids[row["name"]] = row["id"]
        gpus = []
        for gpu in gpus_by_node[row["id"]]:
            ledger.gpu_ids[gpu["uuid"]] = gpu["id"]
            healthy = gpu["present"] and gpu["health"] not in _UNUSABLE_HEALTH
            gpus.append(core.Gpu(gpu["uuid"], gpu["index"], gpu["model"], healthy, gpu["id"] not in held))
        cpu, memory = row["cpu_cores"] * 1000, row["memory_mib"]
        nodes.append(
            core.Node(
                name=row["name"],
                pool=pool_names[row["pool_id"]],
                cpu_milli=cpu,
                memory_mib=memory,
                cpu_free_milli=max(0, cpu - cpu_used[row["id"]]),
                memory_free_mib=max(0, memory - memory_used[row["id"]]),
                gpus=tuple(gpus),
                schedulable=row["state"] == NodeState.READY,
                # A simulated node mounts nothing for real: it takes any workload's volumes.
                storage=None
                if row["runtime"] == RuntimeKind.SIMULATED
                else mountable_backends(_NodeRef(row["id"], row["pool_id"]), backends, pools_of),
                # Only Docker gangs across hosts need a swarm; a node that never said (an older agent) limits nothing.
                fabric=row["swarm"] if row["runtime"] == RuntimeKind.DOCKER else None,
                fabric_manager=row["swarm_manager"],
            )
        )
    return nodes


def _reserved(workloads: list[Row], allocations: list[Row]) -> tuple[defaultdict[int, int], defaultdict[int, int]]:
    """Return the CPU (milli) and memory (MiB) reserved on each node by its active replicas."""
    requests = {row["id"]: (row["cpu_milli"], row["memory_mib"]) for row in workloads}
    cpu: defaultdict[int, int] = defaultdict(int)
    memory: defaultdict[int, int] = defaultdict(int)
    seen: set[tuple[int, int]] = set()
    for allocation in allocations:
        replica = (allocation["workload_id"], allocation["replica"])
        if replica in seen or allocation["workload_id"] not in requests:
            continue
        seen.add(replica)
        cpu_milli, memory_mib = requests[allocation["workload_id"]]
        cpu[allocation["node_id"]] += cpu_milli
        memory[allocation["node_id"]] += memory_mib
    return cpu, memory


def _workloads(
    rows: list[Row],
    allocations: list[Row],
    pool_names: dict[int, str],
    quotas: _Quotas,
    ledger: Ledger,
) -> tuple[list[core.Workload], list[core.Workload]]:
    """Return (pending, running) core workloads; running ones carry their allocation per replica."""
    node_names = {node_id: name for name, node_id in ledger.node_ids.items()}
    replicas: dict[int, dict[int, tuple[str, list[str]]]] = defaultdict(dict)
    for allocation in allocations:
        node = node_names.get(allocation["node_id"], f"node-{allocation['node_id']}")
        slot = replicas[allocation["workload_id"]].setdefault(allocation["replica"], (node, []))
        if allocation["gpu__uuid"] is not None:
            slot[1].append(allocation["gpu__uuid"])
    needs = storage_needs(
        (row["tenant_id"], row["owner_id"], row["project_id"]) for row in rows if row["state"] == WorkloadState.PENDING
    )
    pending, running = [], []
    for row in rows:
        ledger.workloads[str(row["id"])] = row
        if row["state"] == WorkloadState.PENDING:
            storage = needs.get((row["owner_id"], row["project_id"]), frozenset())
            pending.append(_workload(row, pool_names, quotas, (), storage))
        else:
            placed = tuple(
                core.ReplicaAllocation(node, tuple(gpus)) for _, (node, gpus) in sorted(replicas[row["id"]].items())
            )
            running.append(_workload(row, pool_names, quotas, placed))
    return pending, running


def _workload(
    row: Row,
    pool_names: dict[int, str],
    quotas: _Quotas,
    allocation: tuple[core.ReplicaAllocation, ...],
    storage: frozenset[str] = frozenset(),
) -> core.Workload:
    started = row["started_at"] or row["scheduled_at"]
    checkpointed = row["checkpointed_at"]
    return core.Workload(
        id=str(row["id"]),
        tenant=row["tenant__slug"],
        project=row["project__slug"],
        pool=pool_names[row["pool_id"]],
        submitted_at=row["submitted_at"].timestamp(),
        gpus=row["gpus_per_replica"],
        replicas=row["replicas"],
        kind=core.WorkloadKind(row["kind"]),
        priority=PRIORITY_VALUES[row["priority_class"]],
        models=frozenset(row["gpu_models"] or ()),
        cpu_milli=row["cpu_milli"],
        memory_mib=row["memory_mib"],
        started_at=started.timestamp() if started else None,
        allocation=allocation,
        storage=storage,
        checkpointed_at=checkpointed.timestamp() if checkpointed else None,
        limit_s=quotas.limit_of(row),
        predicted_s=row["predicted_runtime_seconds"],
        attained_s=row["attained_seconds"],
        preemptions=row["preemptions"],
    )


@dataclass(frozen=True)
class _Quotas:
    """The quotas as the core reads them, with their owners' names and maximum runtimes by (owner id, pool id)."""

    tenants: tuple[core.TenantQuota, ...]
    projects: tuple[core.ProjectQuota, ...]
    tenant_slugs: dict[int, str]
    project_slugs: dict[int, str]
    tenant_runtimes: dict[tuple[int, int], int]
    project_runtimes: dict[tuple[int, int], int]

    @classmethod
    def read(cls, pool_names: dict[int, str]) -> _Quotas:
        """Read every tenant's and project's quota: two queries."""
        tenant_rows = list(
            TenantQuota.all_tenants.order_by("tenant_id", "pool_id").values(
                "tenant_id", "tenant__slug", "pool_id", "guaranteed", "limit", "weight", "max_runtime_seconds"
            )
        )
        project_rows = list(
            ProjectQuota.all_tenants.order_by("project_id", "pool_id").values(
                "project_id",
                "project__slug",
                "tenant__slug",
                "pool_id",
                "guaranteed",
                "limit",
                "weight",
                "max_runtime_seconds",
            )
        )
        return cls(
            tenants=tuple(_tenant_quota(row, pool_names) for row in tenant_rows),
            projects=tuple(_project_quota(row, pool_names) for row in project_rows),
            tenant_slugs={row["tenant_id"]: row["tenant__slug"] for row in tenant_rows},
            project_slugs={row["project_id"]: row["project__slug"] for row in project_rows},
            tenant_runtimes=_runtimes(tenant_rows, "tenant_id", "max_runtime_seconds"),
            project_runtimes=_runtimes(project_rows, "project_id", "max_runtime_seconds"),
        )

    def limit_of(self, row: Row) -> float | None:
        """Return a workload's effective time limit in seconds: its own, else its project's or tenant's quota
        maximum in its pool; None: none."""
        seconds = row["max_runtime_seconds"]
        if seconds is None:
            seconds = self.project_runtimes.get((row["project_id"], row["pool_id"]))
        if seconds is None:
            seconds = self.tenant_runtimes.get((row["tenant_id"], row["pool_id"]))
        return float(seconds) if seconds is not None else None


def _runtimes(rows: Sequence[Row], owner: str, name: str) -> dict[tuple[int, int], int]:
    return {(row[owner], row["pool_id"]): row[name] for row in rows if row[name] is not None}


def _tenant_quota(r: Row, pool_names: dict[int, str]) -> core.TenantQuota:
    return core.TenantQuota(
        r["tenant__slug"], pool_names[r["pool_id"]], r["guaranteed"], r["limit"], float(r["weight"])
    )


def _project_quota(r: Row, pool_names: dict[int, str]) -> core.ProjectQuota:
    return core.ProjectQuota(
        r["project__slug"], r["tenant__slug"], pool_names[r["pool_id"]], r["guaranteed"], r["limit"], float(r["weight"])
    )
