"""Committing a pass's decisions: preemptions, placements and reasons, with compare-and-swap state changes.

Runs inside the pass's transaction (`jobs.scheduler.shell.run_pass`):
preemptions first (a victim that runs is handed to execution to stop with
its grace period; one that never launched is released and requeued at
once), then placements (rows locked and re-checked, allocations written —
the partial unique index makes a double allocation a database error —
and launches enqueued on commit), then the reasons and queue positions of
the workloads left waiting, and their start estimates and reservations,
each written only where it changed (a placed workload's are cleared).

A preemption's cost is recorded three ways: the victim's totals
(`lost_gpu_seconds`, `preemptions`, and `attained_seconds`, the progress its
checkpoint saved in the attempt that ends), the numbers on its `preempted`
event, and the sentence its owner reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db.models import F

from jobs import dispatch, fast_sql, live
from jobs.choices import ACTIVE_STATES, WORKLOAD_TRANSITIONS, WorkloadKind, WorkloadState
from jobs.models import Allocation, Replica, Workload, WorkloadEvent
from jobs.scheduler import core
from jobs.scheduler.snapshot import Ledger, Row
from jobs.services.stopping import LIVE_REPLICA_STATES, request_replica_stops


@dataclass
class PassResult:
    """What one committed pass did: counts, and how long its phases took in seconds."""

    placed: int = 0
    preempted: int = 0
    waiting: int = 0
    skipped: int = 0
    timings: dict[str, float] = field(default_factory=dict)


def commit(decisions: core.Decisions, ledger: Ledger, now: datetime, result: PassResult) -> None:
    held = _preempt(decisions.preemptions, ledger, now, result)
    _place(decisions.placements, ledger, now, result, held)
    reasons_changed = _record_waiting(decisions.waiting, ledger, result)
    plans_changed = _record_plans(decisions, ledger, now)
    # Live streams hear of it after commit: one message per tenant for the rows, one per moved workload,
    # and one per node whose GPUs changed hands (a workload skipped above is announced unchanged: harmless).
    moved = [int(p.victim) for p in decisions.preemptions] + [int(key) for key in decisions.placements]
    live.publish_workload_changes(sorted({*moved, *reasons_changed, *plans_changed}), state_changed=moved)
    live.publish_gpus_allocated(r.node for replicas in decisions.placements.values() for r in replicas)


def _preempt(preemptions: tuple[core.Preemption, ...], ledger: Ledger, now: datetime, result: PassResult) -> set[str]:
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
    WORKLOAD_TRANSITIONS.check(row["state"], WorkloadState.PREEMPTED)
    preempted = _event(row, row["state"], WorkloadState.PREEMPTED, code, message, now)
    preempted.lost_gpu_seconds = preemption.lost_gpu_seconds
    preempted.overhead_gpu_seconds = preemption.overhead_gpu_seconds
    victim = Workload.all_tenants.filter(pk=row["id"])
    victim.update(
        lost_gpu_seconds=F("lost_gpu_seconds") + preemption.lost_gpu_seconds,
        preemptions=F("preemptions") + 1,
        attained_seconds=F("attained_seconds") + kept_seconds(row),
    )
    if stopping:
        WORKLOAD_TRANSITIONS.move(
            victim,
            from_states=ACTIVE_STATES,
            to_state=WorkloadState.PREEMPTED,
            reason_code=code,
            reason_message=message,
            finished_at=now,
            stop_requested_at=now,
        )
        return [preempted]
    if row["kind"] != WorkloadKind.JOB:
        # A notebook that never launched hibernates at once: its owner resumes it (settling does it otherwise).
        # One UPDATE takes both steps its events record (active -> preempted -> hibernated).
        WORKLOAD_TRANSITIONS.check(WorkloadState.PREEMPTED, WorkloadState.HIBERNATED)
        victim.update(state=WorkloadState.HIBERNATED, reason_code=code, reason_message=message, finished_at=now)
        hibernated = _event(row, WorkloadState.PREEMPTED, WorkloadState.HIBERNATED, code, "Hibernated.", now)
        return [preempted, hibernated]
    WORKLOAD_TRANSITIONS.check(WorkloadState.PREEMPTED, WorkloadState.PENDING)
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


def kept_seconds(row: Row) -> float:
    """Return the run seconds a preempted workload keeps from the attempt that ends: from its start to its latest
    checkpoint of this attempt (0 without one; a checkpoint older than the start belongs to an earlier attempt)."""
    started, checkpointed = row["started_at"] or row["scheduled_at"], row["checkpointed_at"]
    if started is None or checkpointed is None or checkpointed < started:
        return 0.0
    return (checkpointed - started).total_seconds()


def _preemption_message(preemption: core.Preemption) -> str:
    cost = _cost(preemption.lost_gpu_seconds, preemption.overhead_gpu_seconds)
    if preemption.reason is core.Reason.BUDGET:
        return f"Stopped: {preemption.detail} {cost}"
    if preemption.reason is core.Reason.PRIORITY:
        return f"Preempted for higher-priority work in the same project (workload {preemption.for_workload}). {cost}"
    return (
        "Preempted: it ran on borrowed GPUs, and another project needed them back for work "
        f"within its guarantee (workload {preemption.for_workload}). {cost}"
    )


def _cost(lost_gpu_seconds: float, overhead_gpu_seconds: float = 0.0) -> str:
    """Return the sentences that say what a preemption costs: the work thrown away since the last checkpoint,
    and the restart overhead paid again."""
    lost = (
        f"It loses {gpu_time(lost_gpu_seconds)} of work since its last checkpoint (or its start)."
        if lost_gpu_seconds > 0
        else "It loses no work."
    )
    if overhead_gpu_seconds <= 0:
        return lost
    return f"{lost} Restarting costs another {gpu_time(overhead_gpu_seconds)}."


def gpu_time(gpu_seconds: float) -> str:
    """Return GPU-seconds in words: GPU-hours from one hour on, else whole GPU-minutes."""
    hours = gpu_seconds / 3600
    return f"{hours:.1f} GPU-hours" if hours >= 1 else f"{gpu_seconds / 60:.0f} GPU-minutes"


def _lock_in_state(ids: list[int], states: Iterable[str]) -> set[int]:
    """Lock the rows of `ids` and return those still in one of `states` (the compare of compare-and-swap)."""
    return set(
        Workload.all_tenants.select_for_update().filter(pk__in=ids, state__in=list(states)).values_list("pk", flat=True)
    )


def _place(
    placements: Mapping[str, tuple[core.ReplicaAllocation, ...]],
    ledger: Ledger,
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
    WORKLOAD_TRANSITIONS.move(
        Workload.all_tenants.filter(pk__in=placed),
        from_states=[WorkloadState.PENDING],
        to_state=WorkloadState.SCHEDULED,
        scheduled_at=now,
        reason_code="",
        reason_message="",
        reason_hint="",
        queue_position=None,
        estimated_start_at=None,
        estimate_basis="",
        reserved_from=None,
        reserved_gpus=[],
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
    row: Row, replicas: tuple[core.ReplicaAllocation, ...], ledger: Ledger, now: datetime
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


def _record_waiting(waiting: Mapping[str, core.Waiting], ledger: Ledger, result: PassResult) -> list[int]:
    """Write reason, message, hint and queue position of each waiting workload whose values changed; return their ids.

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
        return []
    fast_sql.record_reasons(rows, pending=WorkloadState.PENDING.value)
    return [row[-1] for row in rows]


# An estimate or reservation that moved less than this (all else the same) is not written again: passes run
# every second, and the time a plan rests on moves with them.
ESTIMATE_SLACK_SECONDS = 60.0


def _record_plans(decisions: core.Decisions, ledger: Ledger, now: datetime) -> list[int]:
    """Write the start estimate and reservation of each pending workload whose values changed; return their ids.

    A waiting workload without an estimate, and a pending one without a
    reservation, has its old one cleared. Only pending rows are touched.
    """
    reserved = {r.workload: r for r in decisions.reservations}
    rows = []
    for key, current in ledger.workloads.items():
        if current["state"] != WorkloadState.PENDING or key in decisions.placements:
            continue
        estimate = _estimate(decisions.estimates.get(key))
        reservation = _reservation(reserved.get(key))
        if _plan_changed(current, estimate, reservation):
            rows.append((*estimate, *reservation, current["id"]))
    if rows:
        fast_sql.record_plans(rows, pending=WorkloadState.PENDING.value)
    return [row[-1] for row in rows]


def _estimate(estimate: core.Estimate | None) -> tuple[datetime | None, str]:
    if estimate is None:
        return None, ""
    return datetime.fromtimestamp(estimate.start_at, tz=UTC), estimate.basis


def _reservation(reservation: core.Reservation | None) -> tuple[datetime | None, list[dict[str, Any]]]:
    if reservation is None:
        return None, []
    held = [{"node": replica.node, "gpus": list(replica.gpu_uuids)} for replica in reservation.allocation]
    return datetime.fromtimestamp(reservation.start_at, tz=UTC), held


def _plan_changed(
    current: Row,
    estimate: tuple[datetime | None, str],
    reservation: tuple[datetime | None, list[dict[str, Any]]],
) -> bool:
    """Return whether a workload's stored estimate or reservation differs from the new one (times within
    ESTIMATE_SLACK_SECONDS count as the same)."""
    (start, basis), (since, held) = estimate, reservation
    if current["estimate_basis"] != basis or (current["reserved_gpus"] or []) != held:
        return True
    return _moved(current["estimated_start_at"], start) or _moved(current["reserved_from"], since)


def _moved(stored: datetime | None, new: datetime | None) -> bool:
    if stored is None or new is None:
        return (stored is None) != (new is None)
    return abs((stored - new).total_seconds()) >= ESTIMATE_SLACK_SECONDS


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
