"""Stopping live workloads, and settling them once their replicas are gone.

The ledger decides first: `stop_workload` changes the workload's state (a
compare-and-swap) and only then, on commit, asks each node to stop its
replicas (SIGTERM, the pool's grace period, SIGKILL). Allocations are
released replica by replica as the nodes confirm the replicas exited
(`jobs.services.replicas`), never before, so a GPU is not handed to new
work while the old process still holds it. A workload whose replicas never
started has nothing to wait for and settles at once.

Settling: once no replica of the current attempt is live, every allocation
left is released, and a batch job that was preempted goes back to pending
with `attempt + 1` and its original submission time (its place in
fair-share order).
"""

from __future__ import annotations

import typing
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from common.protocol.messages import Runtime, StopReplica
from inventory.services.installation import installation_id
from jobs import dispatch
from jobs.choices import ACTIVE_STATES, TERMINAL_STATES, ReasonCode, WorkloadKind, WorkloadState
from jobs.models import Allocation, Replica, ReplicaState, Workload, WorkloadEvent
from jobs.services.lifecycle import next_attempt_fields, release_allocations, transition_workload
from jobs.triggers import request_scheduling_pass

LIVE_REPLICA_STATES = (ReplicaState.LAUNCHING, ReplicaState.RUNNING)


def grace_seconds(workload: Workload) -> int:
    """Return the seconds between SIGTERM and SIGKILL for `workload`: its pool's setting, else the default."""
    own = workload.pool.stop_grace_seconds
    return own if own is not None else int(settings.WORKLOAD_STOP_GRACE_SECONDS)


@transaction.atomic
def stop_workload(
    *,
    workload_id: int,
    to_state: WorkloadState,
    reason_code: str,
    message: str,
    from_states: tuple[WorkloadState, ...] = tuple(ACTIVE_STATES),
    **fields: object,
) -> bool:
    """Move the workload to `to_state` if it is in `from_states`, then stop its replicas; return whether it moved.

    Ending states also set `finished_at`. Replicas still live get a stop
    request on commit; with none live the workload settles at once.
    """
    now = timezone.now()
    extra: dict[str, object] = {"stop_requested_at": now, "queue_position": None, **fields}
    if to_state in TERMINAL_STATES or to_state in (WorkloadState.PREEMPTED, WorkloadState.HIBERNATED):
        extra.setdefault("finished_at", now)
    if not transition_workload(
        workload_id=workload_id,
        from_states=from_states,
        to_state=to_state,
        reason_code=reason_code,
        message=message,
        **extra,
    ):
        return False
    workload = Workload.all_tenants.select_related("pool").get(pk=workload_id)
    if not request_replica_stops(workload):
        settle_workload(workload_id=workload_id)
    return True


def request_replica_stops(workload: Workload) -> int:
    """Send a stop for each live replica of the workload's current attempt (on commit); return how many."""
    live = list(
        Replica.all_tenants.filter(workload=workload, attempt=workload.attempt, state__in=LIVE_REPLICA_STATES)
        .select_related("node")
        .order_by("index")
    )
    grace = grace_seconds(workload)
    note_platform_stop(live, workload.reason_message)
    for replica in live:
        dispatch.message_on_commit(stop_message(replica, grace), queue=replica.node.agent_queue)
    return len(live)


PLATFORM_STOP = "Stopped by the platform: "


def note_platform_stop(replicas: list[Replica], reason: str) -> None:
    """Record on each of `replicas` (about to be stopped) that the platform stops it, and why.

    The replica's exit (often 137 or 143: the signal the stop sent) then
    shows this reason, not a bare exit code (`exit_message`).
    """
    note = PLATFORM_STOP + (reason or "its workload no longer runs this attempt.")
    for replica in replicas:
        replica.message = note[:2000]
    Replica.all_tenants.filter(pk__in=[replica.pk for replica in replicas]).update(message=note[:2000])


def exit_message(noted: str, reported: str, exit_code: int | None) -> str:
    """Return what a replica's exit records: the platform's stop reason when `noted` holds one, else `reported`.

    `noted` is the replica's message before the exit, `reported` what the
    node said (the runtime's note, e.g. "killed: out of memory").
    """
    if not noted.startswith(PLATFORM_STOP):
        return reported
    code = f" It exited with code {exit_code} once stopped." if exit_code is not None else ""
    return noted + code


def stop_message(replica: Replica, grace: int, *, remove: bool = True, ended: bool = False) -> StopReplica:
    """Return the agent's `StopReplica` for `replica`.

    `ended` says the ledger already holds the replica's exit (only its
    leftovers go): the agent then sends no exit report of its own, which
    the controller would only have to read and drop.
    """
    return StopReplica(
        node=replica.node.name,
        installation=installation_id(),  # without a handle, the agent finds only this console's replica
        runtime=typing.cast(Runtime, replica.node.runtime),
        name=replica.name,
        handle=replica.handle or {},
        workload_id=replica.workload_id,
        attempt=replica.attempt,
        replica=replica.index,
        grace_seconds=grace,
        remove=remove,
        ended=ended,
    )


@transaction.atomic
def settle_workload(*, workload_id: int) -> bool:
    """Finish what a stop started once no replica of the current attempt is live; return whether it settled.

    Releases every allocation left and requeues a preempted batch job. A
    workload still running normally is left alone.
    """
    workload = Workload.all_tenants.select_for_update().filter(pk=workload_id).first()
    if workload is None or workload.state in ACTIVE_STATES:
        return False
    if Replica.all_tenants.filter(workload=workload, attempt=workload.attempt, state__in=LIVE_REPLICA_STATES).exists():
        return False
    released = release_allocations(workload_id=workload_id)
    if workload.state == WorkloadState.PREEMPTED and _requeued(workload):
        what = "lost" if workload.reason_code == ReasonCode.ENGINE_LOST_RUN else "preempted"
        requeue_workload(workload=workload, message=f"Requeued: the {what} attempt has stopped.")
    elif workload.state == WorkloadState.PREEMPTED:
        # A notebook preempted for other work keeps its files and waits for its owner to resume it.
        transition_workload(
            workload_id=workload.pk,
            from_states=[WorkloadState.PREEMPTED],
            to_state=WorkloadState.HIBERNATED,
            reason_code=workload.reason_code,
            message="Hibernated: its GPU went to other work. Its files are kept; Resume queues it again.",
        )
    if released:
        request_scheduling_pass()
    return True


def _requeued(workload: Workload) -> bool:
    """Whether a preempted workload goes back to the queue: a batch job always; a notebook only after a lost run.

    A notebook preempted for someone else's work is not restarted behind its
    owner's back (it hibernates); one whose run the node's engine lost never
    really started.
    """
    return workload.kind == WorkloadKind.JOB or workload.reason_code == ReasonCode.ENGINE_LOST_RUN


def requeue_workload(*, workload: Workload, message: str) -> bool:
    """Move a preempted batch job back to pending as a new attempt, keeping its submission time."""
    moved = transition_workload(
        workload_id=workload.pk,
        from_states=[WorkloadState.PREEMPTED],
        to_state=WorkloadState.PENDING,
        reason_code=workload.reason_code,
        message=message,
        **next_attempt_fields(),
    )
    if moved:
        request_scheduling_pass()
    return moved


def requeues(workload_id: int, reason_code: str) -> int:
    """Return how many times the workload was already requeued for `reason_code` (NODE_LOST, ENGINE_LOST_RUN)."""
    return WorkloadEvent.all_tenants.filter(
        workload_id=workload_id, to_state=WorkloadState.PREEMPTED, reason_code=reason_code
    ).count()


def stale_stops(*, now: datetime, extra_seconds: int = 30) -> list[Workload]:
    """Return workloads asked to stop more than their grace period (+ `extra_seconds`) ago with replicas still live."""
    candidates = (
        Workload.all_tenants.filter(stop_requested_at__isnull=False)
        .exclude(state__in=ACTIVE_STATES)
        .filter(
            replica_runs__attempt=F("attempt"),
            replica_runs__state__in=LIVE_REPLICA_STATES,
        )
        .select_related("pool")
        .distinct()
    )
    return [
        w
        for w in candidates
        if w.stop_requested_at and (now - w.stop_requested_at).total_seconds() > grace_seconds(w) + extra_seconds
    ]


def dangling_allocations() -> list[int]:
    """Return ids of workloads that hold allocations though they are not active and have no live replica."""
    holders = set(
        Allocation.all_tenants.filter(released_at__isnull=True)
        .exclude(workload__state__in=ACTIVE_STATES)
        .values_list("workload_id", flat=True)
    )
    live = set(
        Replica.all_tenants.filter(
            workload_id__in=holders, attempt=F("workload__attempt"), state__in=LIVE_REPLICA_STATES
        ).values_list("workload_id", flat=True)
    )
    return sorted(holders - live)
