"""Periodic rules over live workloads: maximum runtime, start timeout, lost nodes.

Each rule reads the ledger set-based, then stops the workloads it picked one
by one through `stop_workload` (a compare-and-swap each, so running the
same rule twice at once stops nothing twice).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from common import control
from common.task_names import CONFIRM_START_TIMEOUTS
from inventory.choices import NodeState
from jobs import dispatch
from jobs.choices import ACTIVE_STATES, ReasonCode, WorkloadKind, WorkloadState
from jobs.models import Allocation, Replica, ReplicaState, Workload
from jobs.services.stopping import (
    LIVE_REPLICA_STATES,
    requeues,
    settle_workload,
    stop_workload,
)


def enforce_time_limits(*, now: datetime | None = None, confirm_later: bool = False) -> dict[str, int]:
    """Fail running workloads past their maximum runtime and launches stuck past the start timeout; return counts.

    Start timeouts are judged only by a process that has run for a whole
    timeout (`common.control.watching_for`). The controller passes the
    moment its evidence is complete as `now` (`common.control.evidence_time`),
    so a start report still waiting in its queue is never overtaken.

    With `confirm_later` (the controller's periodic run) the overdue launches
    are not failed here but sent through the control queue once more
    (`jobs.confirm_start_timeouts`): a simulated node's start is itself a
    message on that queue, taken before this run but reporting after it, so
    its report is behind this run and ahead of the confirmation.
    """
    moment = now or timezone.now()
    over = 0
    running = Workload.all_tenants.filter(state=WorkloadState.RUNNING, max_runtime_seconds__isnull=False)
    for workload in running.only("pk", "started_at", "max_runtime_seconds"):
        limit = workload.max_runtime_seconds or 0
        if workload.started_at and moment - workload.started_at >= timedelta(seconds=limit):
            over += stop_workload(
                workload_id=workload.pk,
                from_states=(WorkloadState.RUNNING,),
                to_state=WorkloadState.FAILED,
                reason_code=ReasonCode.MAX_RUNTIME,
                message=f"Stopped: it reached its maximum runtime of {_duration(limit)}.",
            )
    if not control.watching_for(settings.WORKLOAD_START_TIMEOUT_SECONDS):
        # Just started: launches the broker lost are being sent again (reconcile); they get their full time.
        return {"max_runtime": over, "start_timeout": 0}
    cutoff = moment - timedelta(seconds=settings.WORKLOAD_START_TIMEOUT_SECONDS)
    stuck = stuck_launches(cutoff)
    if confirm_later:
        if stuck:
            kwargs = {"workload_ids": stuck, "cutoff": cutoff.isoformat()}
            dispatch.send(CONFIRM_START_TIMEOUTS, queue=control.CONTROL_QUEUE, kwargs=kwargs)
        return {"max_runtime": over, "start_timeout": 0, "start_timeout_to_confirm": len(stuck)}
    return {"max_runtime": over, "start_timeout": fail_start_timeouts(stuck, cutoff=cutoff)}


def fail_start_timeouts(workload_ids: list[int], *, cutoff: datetime) -> int:
    """Fail those of `workload_ids` whose start is still overdue at `cutoff` (a report since may have started
    them); return how many were failed."""
    message = f"Failed: it did not start within {_duration(settings.WORKLOAD_START_TIMEOUT_SECONDS)}."
    return sum(
        stop_workload(
            workload_id=pk,
            from_states=(WorkloadState.SCHEDULED, WorkloadState.STARTING),
            to_state=WorkloadState.FAILED,
            reason_code=ReasonCode.START_TIMEOUT,
            message=message,
        )
        for pk in stuck_launches(cutoff, among=workload_ids)
    )


def stuck_launches(cutoff: datetime, *, among: list[int] | None = None) -> list[int]:
    """Return the workloads whose start is overdue at `cutoff`: placed but never launched before it, or whose
    nodes were sent their start before it and never reported it (only those of `among`, when given).

    A workload's start time counts from when its nodes were asked (its
    current attempt's replica rows are made then), not from its placement:
    a launch that waited in the controller's own queue is the controller's
    delay, not the workload's.
    """
    placed = Workload.all_tenants.filter(state=WorkloadState.SCHEDULED, scheduled_at__lt=cutoff)
    asked = Replica.all_tenants.filter(
        workload__state=WorkloadState.STARTING, attempt=F("workload__attempt"), index=0, created_at__lt=cutoff
    )
    if among is not None:
        placed, asked = placed.filter(pk__in=among), asked.filter(workload_id__in=among)
    return sorted({*placed.values_list("pk", flat=True), *asked.values_list("workload_id", flat=True)})


def _duration(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def handle_lost_nodes() -> int:
    """Deal with the work of unreachable nodes; return how many workloads were affected.

    Their replicas are marked lost and their GPUs released (nothing can be
    stopped there). A batch job goes back to the queue up to its requeue
    limit, then fails with NODE_LOST; a notebook is marked lost and its
    owner told: it is never restarted behind their back. Replicas of the
    same gang on healthy nodes are stopped.
    """
    lost = list(
        Replica.all_tenants.filter(node__state=NodeState.UNREACHABLE, state__in=LIVE_REPLICA_STATES)
        .select_related("node")
        .order_by("workload_id", "index")
    )
    affected = 0
    for workload_id in sorted({replica.workload_id for replica in lost}):
        nodes = sorted({r.node.name for r in lost if r.workload_id == workload_id})
        affected += _lose(workload_id, [r for r in lost if r.workload_id == workload_id], nodes)
    return affected


@transaction.atomic
def _lose(workload_id: int, replicas: list[Replica], nodes: list[str]) -> int:
    workload = Workload.all_tenants.select_for_update().filter(pk=workload_id).first()
    if workload is None:
        return 0
    now = timezone.now()
    Replica.all_tenants.filter(pk__in=[r.pk for r in replicas], state__in=LIVE_REPLICA_STATES).update(
        state=ReplicaState.LOST, finished_at=now, message="The node stopped answering."
    )
    # The GPUs of the lost nodes are gone with them: nothing there can be stopped or waited for.
    Allocation.all_tenants.filter(workload_id=workload_id, node__name__in=nodes, released_at__isnull=True).update(
        released_at=now
    )
    where = ", ".join(nodes)
    if workload.attempt != replicas[0].attempt or workload.state not in ACTIVE_STATES:
        settle_workload(workload_id=workload_id)
        return 1
    if workload.kind == WorkloadKind.NOTEBOOK:
        target, message = WorkloadState.LOST, f"Node {where} was lost; the notebook session ended with it."
    elif (done := requeues(workload_id, ReasonCode.NODE_LOST)) < workload.requeue_limit:
        target = WorkloadState.PREEMPTED
        message = f"Node {where} was lost; requeued (requeue {done + 1} of {workload.requeue_limit})."
    else:
        target = WorkloadState.FAILED
        message = f"Node {where} was lost and the job used all {workload.requeue_limit} requeues."
    stop_workload(
        workload_id=workload_id,
        from_states=tuple(ACTIVE_STATES),
        to_state=target,
        reason_code=ReasonCode.NODE_LOST,
        message=message,
    )
    return 1
