"""The scheduling shell: read the ledger into a snapshot, run the pure core, commit its decisions.

A pass is one transaction:

1. take the single-flight lock (a transaction-scoped Postgres advisory lock;
   on SQLite, a process lock plus the IMMEDIATE write transaction the
   embedded settings use, since the embedded console is one process);
2. build the snapshot in a fixed number of set-based queries, whatever the
   number of workloads, nodes and GPUs;
3. run `jobs.scheduler.core.schedule`;
4. commit: preemptions release their allocations first, then placements move
   pending workloads to `scheduled` with compare-and-swap (rows locked and
   re-checked, so a workload cancelled meanwhile is skipped) and create their
   allocations (the partial unique index makes a double allocation a database
   error that rolls the whole pass back), then the reasons and queue
   positions of the workloads left waiting are written where they changed.

Once the pass commits, placed workloads are handed to execution
(`jobs.launch_workloads`), and preempted ones that run are stopped by their
nodes with their grace period (see `jobs.services.stopping`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from inventory.choices import GpuHealth, NodeState
from inventory.models import Gpu, Node, NodePool
from jobs import dispatch
from jobs.choices import ACTIVE_STATES, PRIORITY_VALUES, WorkloadKind, WorkloadState
from jobs.models import Allocation, Replica, Workload, WorkloadEvent
from jobs.scheduler import core
from jobs.services.stopping import LIVE_REPLICA_STATES, request_replica_stops
from tenants.models import ProjectQuota, TenantQuota

log = logging.getLogger(__name__)

# One row of a `.values()` query: read-only, keyed by field name.
Row = Mapping[str, Any]

# An arbitrary 64-bit key naming the scheduler's advisory lock ("gpucloud" in ASCII).
ADVISORY_LOCK_KEY = 0x67707563_6C6F7564
_local_lock = threading.Lock()

# GPUs that failed or vanished are never offered to the scheduler; degraded ones still are.
_UNUSABLE_HEALTH = {GpuHealth.FAILED}
# Nodes that never served or never will again: not part of the snapshot at all.
_NOT_IN_SERVICE = [NodeState.REGISTERED, NodeState.PROVISIONING, NodeState.FAILED, NodeState.RETIRED]


@dataclass
class PassResult:
    """What one committed pass did: counts, and how long its phases took in seconds."""

    placed: int = 0
    preempted: int = 0
    waiting: int = 0
    skipped: int = 0
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class _Ledger:
    """What the snapshot was built from, kept to commit the decisions: ids and current values by workload."""

    workloads: dict[str, Row] = field(default_factory=dict)
    node_ids: dict[str, int] = field(default_factory=dict)
    gpu_ids: dict[str, int] = field(default_factory=dict)


@contextmanager
def _single_flight() -> Iterator[bool]:
    """Yield whether this pass holds the scheduler lock; must run inside the pass's transaction."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK_KEY])
            yield bool(cursor.fetchone()[0])
        return
    acquired = _local_lock.acquire(blocking=False)
    try:
        yield acquired
    finally:
        if acquired:
            _local_lock.release()


def run_pass(*, now: datetime | None = None, config: core.SchedulerConfig | None = None) -> PassResult | None:
    """Run one scheduling pass and commit it; return what it did, or None when another pass holds the lock.

    All or nothing: an error anywhere (a double allocation refused by the
    database included) rolls the whole pass back and is raised.
    """
    moment = now or timezone.now()
    with transaction.atomic(), _single_flight() as acquired:
        if not acquired:
            return None
        result = PassResult()
        started = time.perf_counter()
        snapshot, ledger = build_snapshot(now=moment, config=config or scheduler_config())
        built = time.perf_counter()
        decisions = core.schedule(snapshot)
        decided = time.perf_counter()
        _commit(decisions, ledger, moment, result)
        result.timings = {
            "snapshot": built - started,
            "core": decided - built,
            "commit": time.perf_counter() - decided,
        }
    return result


def scheduler_config() -> core.SchedulerConfig:
    """Return the core's knobs from the settings (SCHEDULER_MIN_RUNTIME_SECONDS, SCHEDULER_PREEMPTION)."""
    return core.SchedulerConfig(
        min_runtime_s=float(settings.SCHEDULER_MIN_RUNTIME_SECONDS), preemption=settings.SCHEDULER_PREEMPTION
    )


# --- snapshot ---------------------------------------------------------------------


def build_snapshot(*, now: datetime, config: core.SchedulerConfig) -> tuple[core.Snapshot, _Ledger]:
    """Return the snapshot of the ledger at `now`, and the ids the commit needs; seven queries in all."""
    ledger = _Ledger()
    pools = list(NodePool.objects.values("id", "name", "placement_policy", "dedicated_tenant__slug"))
    pool_names = {pool["id"]: pool["name"] for pool in pools}
    workloads = _workload_rows()
    allocations = _active_allocations()
    nodes = _nodes(pool_names, workloads, allocations, ledger)
    with_nodes = {node.pool for node in nodes}
    in_service = {node.pool for node in nodes if node.schedulable}
    pending, running = _workloads(workloads, allocations, pool_names, ledger)
    snapshot = core.Snapshot(
        now=now.timestamp(),
        pools=tuple(_pool(pool, with_nodes, in_service) for pool in pools),
        nodes=tuple(nodes),
        tenant_quotas=_tenant_quotas(pool_names),
        project_quotas=_project_quotas(pool_names),
        running=tuple(running),
        pending=tuple(pending),
        config=config,
    )
    return snapshot, ledger


def _pool(row: Row, with_nodes: set[str], in_service: set[str]) -> core.Pool:
    # A pool whose every node is out of service (cordoned, draining, ...) is reported as cordoned.
    return core.Pool(
        name=row["name"],
        policy=core.PlacementPolicy(row["placement_policy"]),
        dedicated_tenant=row["dedicated_tenant__slug"],
        cordoned=row["name"] in with_nodes and row["name"] not in in_service,
    )


def _workload_rows() -> list[Row]:
    states = [WorkloadState.PENDING, *ACTIVE_STATES]
    return list(
        Workload.all_tenants.filter(state__in=states)
        .order_by("id")
        .values(
            "id",
            "tenant_id",
            "tenant__slug",
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
    ledger: _Ledger,
) -> list[core.Node]:
    """Return every node in service with what is free on it: GPUs not held, CPU and memory not reserved."""
    rows = list(
        Node.objects.exclude(state__in=_NOT_IN_SERVICE)
        .order_by("name")
        .values("id", "name", "pool_id", "state", "cpu_cores", "memory_mb")
    )
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
        cpu, memory = row["cpu_cores"] * 1000, row["memory_mb"]
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
    ledger: _Ledger,
) -> tuple[list[core.Workload], list[core.Workload]]:
    """Return (pending, running) core workloads; running ones carry their allocation per replica."""
    node_names = {node_id: name for name, node_id in ledger.node_ids.items()}
    replicas: dict[int, dict[int, tuple[str, list[str]]]] = defaultdict(dict)
    for allocation in allocations:
        node = node_names.get(allocation["node_id"], f"node-{allocation['node_id']}")
        slot = replicas[allocation["workload_id"]].setdefault(allocation["replica"], (node, []))
        if allocation["gpu__uuid"] is not None:
            slot[1].append(allocation["gpu__uuid"])
    pending, running = [], []
    for row in rows:
        ledger.workloads[str(row["id"])] = row
        if row["state"] == WorkloadState.PENDING:
            pending.append(_workload(row, pool_names, ()))
        else:
            placed = tuple(
                core.ReplicaAllocation(node, tuple(gpus)) for _, (node, gpus) in sorted(replicas[row["id"]].items())
            )
            running.append(_workload(row, pool_names, placed))
    return pending, running


def _workload(row: Row, pool_names: dict[int, str], allocation: tuple[core.ReplicaAllocation, ...]) -> core.Workload:
    started = row["started_at"] or row["scheduled_at"]
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
    )


def _tenant_quotas(pool_names: dict[int, str]) -> tuple[core.TenantQuota, ...]:
    rows = TenantQuota.all_tenants.order_by("tenant_id", "pool_id").values(
        "tenant__slug", "pool_id", "guaranteed", "limit", "weight"
    )
    return tuple(
        core.TenantQuota(r["tenant__slug"], pool_names[r["pool_id"]], r["guaranteed"], r["limit"], float(r["weight"]))
        for r in rows
    )


def _project_quotas(pool_names: dict[int, str]) -> tuple[core.ProjectQuota, ...]:
    rows = ProjectQuota.all_tenants.order_by("project_id", "pool_id").values(
        "project__slug", "tenant__slug", "pool_id", "guaranteed", "limit", "weight"
    )
    return tuple(
        core.ProjectQuota(
            r["project__slug"],
            r["tenant__slug"],
            pool_names[r["pool_id"]],
            r["guaranteed"],
            r["limit"],
            float(r["weight"]),
        )
        for r in rows
    )


# --- commit -----------------------------------------------------------------------


def _commit(decisions: core.Decisions, ledger: _Ledger, now: datetime, result: PassResult) -> None:
    held = _preempt(decisions.preemptions, ledger, now, result)
    _place(decisions.placements, ledger, now, result, held)
    _record_waiting(decisions.waiting, ledger, result)


def _preempt(preemptions: tuple[core.Preemption, ...], ledger: _Ledger, now: datetime, result: PassResult) -> set[str]:
    """Preempt the victims; return the UUIDs of GPUs they hold until their nodes confirm they stopped.

    A victim with replicas launched is marked preempted and handed to
    execution, which stops it with its grace period and releases its GPUs
    (and requeues a batch job) once the node confirms. A victim that never
    launched has nothing to stop: its GPUs are released and a batch job is
    requeued at once. Either way a requeued job keeps its submission time,
    so it keeps its place in order. Notebooks are not restarted behind
    their owner's back: they end preempted.
    """
    if not preemptions:
        return set()
    victims = _lock_in_state([int(p.victim) for p in preemptions], ACTIVE_STATES)
    stopping = set(
        Replica.all_tenants.filter(
            workload_id__in=victims, attempt=F("workload__attempt"), state__in=LIVE_REPLICA_STATES
        ).values_list("workload_id", flat=True)
    )
    held = set(
        Allocation.all_tenants.filter(
            workload_id__in=stopping, released_at__isnull=True, gpu__isnull=False
        ).values_list("gpu__uuid", flat=True)
    )
    Allocation.all_tenants.filter(workload_id__in=victims - stopping, released_at__isnull=True).update(released_at=now)
    events: list[WorkloadEvent] = []
    for preemption in preemptions:
        if int(preemption.victim) not in victims:
            result.skipped += 1
            continue
        row = ledger.workloads[preemption.victim]
        events += _requeue_or_end(row, preemption, now, stopping=row["id"] in stopping)
        result.preempted += 1
    WorkloadEvent.all_tenants.bulk_create(events)
    for workload in Workload.all_tenants.select_related("pool").filter(pk__in=stopping):
        request_replica_stops(workload)
    return held


def _requeue_or_end(row: Row, preemption: core.Preemption, now: datetime, *, stopping: bool) -> list[WorkloadEvent]:
    code, message = preemption.reason.value, _preemption_message(preemption)
    preempted = _event(row, row["state"], WorkloadState.PREEMPTED, code, message, now)
    victim = Workload.all_tenants.filter(pk=row["id"])
    if stopping or row["kind"] != WorkloadKind.JOB:
        victim.update(
            state=WorkloadState.PREEMPTED,
            reason_code=code,
            reason_message=message,
            finished_at=now,
            stop_requested_at=now if stopping else None,
        )
        return [preempted]
    victim.update(
        state=WorkloadState.PENDING,
        attempt=F("attempt") + 1,
        reason_code=code,
        reason_message=message,
        reason_hint="",
        queue_position=None,
        scheduled_at=None,
        started_at=None,
    )
    requeued = _event(row, WorkloadState.PREEMPTED, WorkloadState.PENDING, code, "Requeued after preemption.", now)
    return [preempted, requeued]


def _preemption_message(preemption: core.Preemption) -> str:
    if preemption.reason is core.Reason.PRIORITY:
        return f"Preempted for higher-priority work in the same project (workload {preemption.for_workload})."
    return (
        "Preempted: it ran on borrowed GPUs, and another project needed them back for work "
        f"within its guarantee (workload {preemption.for_workload})."
    )


def _lock_in_state(ids: list[int], states: Iterable[str]) -> set[int]:
    """Lock the rows of `ids` and return those still in one of `states` (the compare of compare-and-swap)."""
    return set(
        Workload.all_tenants.select_for_update().filter(pk__in=ids, state__in=list(states)).values_list("pk", flat=True)
    )


def _place(
    placements: Mapping[str, tuple[core.ReplicaAllocation, ...]],
    ledger: _Ledger,
    now: datetime,
    result: PassResult,
    held: set[str],
) -> None:
    """Move placed workloads from pending to scheduled, record their allocations, and launch them on commit.

    A workload that left `pending` since the snapshot (cancelled) is skipped;
    so is one placed on GPUs that preempted work still holds while it stops
    (a later pass places it once they are released). Skipped capacity is
    simply unused until the next pass.
    """
    if not placements:
        return
    ready = [
        int(key)
        for key, replicas in placements.items()
        if not any(uuid in held for replica in replicas for uuid in replica.gpu_uuids)
    ]
    placed = _lock_in_state(ready, [WorkloadState.PENDING])
    result.skipped += len(placements) - len(placed)
    Workload.all_tenants.filter(pk__in=placed).update(
        state=WorkloadState.SCHEDULED,
        scheduled_at=now,
        reason_code="",
        reason_message="",
        reason_hint="",
        queue_position=None,
    )
    allocations: list[Allocation] = []
    events: list[WorkloadEvent] = []
    for key, replicas in sorted(placements.items(), key=lambda item: int(item[0])):
        row = ledger.workloads[key]
        if row["id"] not in placed:
            continue
        allocations += _allocations(row, replicas, ledger, now)
        events.append(_event(row, WorkloadState.PENDING, WorkloadState.SCHEDULED, "", _placed_message(replicas), now))
    Allocation.all_tenants.bulk_create(allocations, batch_size=1000)
    WorkloadEvent.all_tenants.bulk_create(events, batch_size=1000)
    result.placed = len(placed)
    dispatch.launch_on_commit(placed)


def _allocations(
    row: Row, replicas: tuple[core.ReplicaAllocation, ...], ledger: _Ledger, now: datetime
) -> list[Allocation]:
    made = []
    for replica, placement in enumerate(replicas):
        node_id = ledger.node_ids[placement.node]
        # A CPU-only replica still records where it runs, with no GPU.
        gpu_ids: list[int | None] = [ledger.gpu_ids[uuid] for uuid in placement.gpu_uuids] or [None]
        made += [
            Allocation(
                workload_id=row["id"],
                tenant_id=row["tenant_id"],
                replica=replica,
                node_id=node_id,
                gpu_id=gpu_id,
                created_at=now,
            )
            for gpu_id in gpu_ids
        ]
    return made


def _placed_message(replicas: tuple[core.ReplicaAllocation, ...]) -> str:
    where = ", ".join(f"{r.node} ({len(r.gpu_uuids)} GPU{'s' if len(r.gpu_uuids) != 1 else ''})" for r in replicas)
    return f"Scheduled on {where}."


def _record_waiting(waiting: Mapping[str, core.Waiting], ledger: _Ledger, result: PassResult) -> None:
    """Write reason, message, hint and queue position of each waiting workload whose values changed.

    Only pending rows are touched (`state` is part of the WHERE), so a
    workload cancelled meanwhile keeps its own reason.
    """
    rows = []
    for key, verdict in waiting.items():
        current = ledger.workloads[key]
        values = (verdict.reason.value, verdict.message, verdict.hint or "", verdict.position)
        if values != (
            current["reason_code"],
            current["reason_message"],
            current["reason_hint"],
            current["queue_position"],
        ):
            rows.append((*values, current["id"]))
    result.waiting = len(waiting)
    if not rows:
        return
    table = connection.ops.quote_name(Workload._meta.db_table)
    # The only interpolated part is the model's own table name, quoted by the backend; executemany is
    # pipelined by the driver, where bulk_update would build a CASE expression per row and field.
    sql = (
        f"UPDATE {table} SET reason_code = %s, reason_message = %s, reason_hint = %s, queue_position = %s "  # noqa: S608
        "WHERE id = %s AND state = 'pending'"
    )
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _event(row: Row, from_state: str, to_state: str, reason_code: str, message: str, now: datetime) -> WorkloadEvent:
    return WorkloadEvent(
        workload_id=row["id"],
        tenant_id=row["tenant_id"],
        kind="workload.state_changed",
        from_state=from_state,
        to_state=to_state,
        reason_code=reason_code,
        message=message,
        created_at=now,
    )
