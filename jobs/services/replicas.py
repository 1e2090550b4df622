"""What the agents report about replicas: pulling its image, started, ready (notebooks), exited.

Each report is idempotent and safe out of order: a duplicate changes
nothing; a new one announces the workload's row to its tenant's events
stream, whose pages show the launch steps the replicas reached; a report
about an attempt the ledger no longer runs (cancelled, preempted,
superseded) makes the controller ask the node to stop that replica
instead of reviving the workload.
"""

from __future__ import annotations

import logging
import math
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs import dispatch, live
from jobs.choices import ReasonCode, WorkloadKind, WorkloadState
from jobs.models import Allocation, Replica, ReplicaState, Workload, WorkloadEvent
from jobs.services.endpoints import endpoint_problem, is_local_node
from jobs.services.lifecycle import transition_workload
from jobs.services.stopping import (
    exit_message,
    grace_seconds,
    note_platform_stop,
    requeues,
    settle_workload,
    stop_message,
    stop_workload,
)

log = logging.getLogger(__name__)

_LIVE = (WorkloadState.STARTING, WorkloadState.RUNNING)
# Exit codes of a process ended by SIGKILL (128 + 9) and SIGTERM (128 + 15), as Docker and shells report them.
SIGKILL_EXIT, SIGTERM_EXIT = 137, 143


def _locked_replica(workload_id: int, attempt: int, index: int) -> Replica | None:
    return (
        # Lock the replica and its workload only: the node's and pool's rows are read, and locking them would
        # serialize every report of a pool and block heartbeats and submissions that check keys to them.
        Replica.all_tenants.select_for_update(of=("self", "workload"))
        .select_related("node", "workload__pool")
        .filter(workload_id=workload_id, attempt=attempt, index=index)
        .first()
    )


def _current(replica: Replica) -> bool:
    """Return whether `replica` belongs to the attempt its workload is running now."""
    workload = replica.workload
    return workload.attempt == replica.attempt and workload.state in _LIVE


@transaction.atomic
def record_replica_started(*, workload_id: int, attempt: int, replica: int, handle: dict, endpoint: str = "") -> bool:
    """Record that the node started the replica; return whether the workload still wants it running.

    A replica of an attempt that is no longer running is stopped again at once.
    """
    row = _locked_replica(workload_id, attempt, replica)
    if row is None:
        log.warning("start reported for unknown replica %s/%s/%s", workload_id, attempt, replica)
        return False
    endpoint = _endpoint_on_node(row, endpoint)
    if row.state in (ReplicaState.EXITED, ReplicaState.LOST):
        # Its exit overtook this report (two workers took them at once) and counted it as started: nothing
        # runs to stop. Keep what only this report knows.
        if not row.handle:
            row.handle, row.endpoint = handle, endpoint
            row.save(update_fields=["handle", "endpoint"])
        return False
    if row.state == ReplicaState.LAUNCHING:
        row.state, row.handle, row.endpoint, row.started_at = ReplicaState.RUNNING, handle, endpoint, timezone.now()
        row.save(update_fields=["state", "handle", "endpoint", "started_at"])
        live.publish_workload_changes([workload_id])
    if not _current(row):
        grace = grace_seconds(row.workload)
        note_platform_stop([row], row.workload.reason_message)
        dispatch.message_on_commit(stop_message(row, grace), queue=row.node.agent_queue)
        return False
    _running_when_complete(row.workload)
    return True


def _endpoint_on_node(row: Replica, endpoint: str) -> str:
    """Return `endpoint` when the replica's node may report it (`jobs.services.endpoints`), else "" (logged).

    The gateway refuses a joined node's report before it gets here; this holds
    every other path (the co-located agent, a task sent to the queue directly)
    to the same rule, so the proxy never connects where the node pointed it.
    """
    problem = endpoint_problem(endpoint, row.node, local=is_local_node(row.node))
    if problem is None:
        return endpoint
    log.warning(
        "endpoint of replica %s/%s/%s on node %s refused: %s",
        row.workload_id,
        row.attempt,
        row.index,
        row.node.name,
        problem,
    )
    return ""


@transaction.atomic
def record_replica_pulling(*, workload_id: int, attempt: int, replica: int, progress: dict[str, Any]) -> bool:
    """Record how far the node's pull of the replica's image got; return whether this report changed anything.

    `progress` is the agent's `PullProgress` as JSON. Reports of one pull
    are ordered by their `seconds`, a retried start's new pull by its
    `began_at`: one not newer than what is stored changes nothing, nor does
    any report once the pull is recorded as done, nor progress about a
    replica that already runs (a late report never moves it back). The
    last report (`done`) is taken even after the start: it ends the pull,
    no later than the start, and writes the workload event "Node X pulled
    image Y in N s". Each change announces the workload's row to its events
    stream.
    """
    row = _locked_replica(workload_id, attempt, replica)
    report = _pull_report(progress)
    if row is None or row.pull_finished_at is not None:
        return False
    if not report["done"] and row.state != ReplicaState.LAUNCHING:
        return False
    if row.pull_progress and _pull_order(report) <= _pull_order(row.pull_progress):
        return False
    now = timezone.now()
    if row.pull_started_at is None:
        row.pull_started_at = max(now - timedelta(seconds=report["seconds"]), row.created_at)
    if report["done"]:
        row.pull_finished_at = max(min(now, row.started_at or now), row.pull_started_at)
        _pulled_event(row, report)
    row.pull_progress = report
    row.save(update_fields=["pull_started_at", "pull_finished_at", "pull_progress"])
    live.publish_workload_changes([workload_id])
    return True


def _pull_report(progress: dict[str, Any]) -> dict[str, Any]:
    """Return the agent's progress with every field checked and bounded (a node is an untrusted peer)."""

    def count(name: str) -> int:
        value = progress.get(name)
        return min(max(int(value), 0), 2**53) if isinstance(value, int | float) and math.isfinite(value) else 0

    def seconds(name: str) -> float:
        value = progress.get(name)
        return max(float(value), 0.0) if isinstance(value, int | float) and math.isfinite(value) else 0.0

    return {
        "image": str(progress.get("image") or "")[:300],
        "began_at": seconds("began_at"),
        "seconds": min(seconds("seconds"), 86_400.0),
        **{name: count(name) for name in ("layers_done", "layers_total", "bytes_done", "bytes_total")},
        "done": progress.get("done") is True,
    }


def _pull_order(report: dict[str, Any]) -> tuple[float, float, bool]:
    """Order of a pull's reports: by pull, then time into it; the last one comes after any taken at the same time."""
    return float(report.get("began_at") or 0.0), float(report.get("seconds") or 0.0), report.get("done") is True


def _pulled_event(row: Replica, report: dict[str, Any]) -> None:
    size = f", {report['bytes_total'] / 1e6:.1f} MB" if report["bytes_total"] else ""
    WorkloadEvent.all_tenants.create(
        tenant_id=row.tenant_id,
        workload_id=row.workload_id,
        kind="workload.image_pulled",
        message=f"Node {row.node.name} pulled image {report['image']} in {report['seconds']:.1f} s{size}.",
        created_at=row.pull_finished_at or timezone.now(),
    )


@transaction.atomic
def record_replica_ready(*, workload_id: int, attempt: int, replica: int) -> bool:
    """Record that the replica's service answered (Jupyter's status endpoint); return whether it was new."""
    row = _locked_replica(workload_id, attempt, replica)
    if row is None or row.ready_at is not None:
        return False
    row.ready_at = timezone.now()
    row.save(update_fields=["ready_at"])
    live.publish_workload_changes([workload_id])
    if _current(row):
        _running_when_complete(row.workload)
    return True


def _running_when_complete(workload: Workload) -> None:
    """Move a starting workload to running once every replica runs (and a notebook's Jupyter answered)."""
    if workload.state != WorkloadState.STARTING:
        return
    rows = list(Replica.all_tenants.filter(workload=workload, attempt=workload.attempt).select_related("node"))
    if not rows or any(row.state != ReplicaState.RUNNING for row in rows):
        return
    if workload.kind == WorkloadKind.NOTEBOOK and not all(row.ready_at for row in rows if row.index == 0):
        return
    nodes = sorted({row.node.name for row in rows})
    transition_workload(
        workload_id=workload.pk,
        from_states=[WorkloadState.STARTING],
        to_state=WorkloadState.RUNNING,
        message=f"Running on {', '.join(nodes)}.",
        started_at=timezone.now(),
        last_activity_at=timezone.now(),
    )


@transaction.atomic
def record_replica_exited(
    *,
    workload_id: int,
    attempt: int,
    replica: int,
    exit_code: int | None,
    message: str = "",
    launch_failed: bool = False,
    unobserved: bool = False,
) -> bool:
    """Record that the replica ended (or could not be launched); return whether this report was new.

    The replica's GPUs are released. A failing replica fails the whole gang
    (the others are stopped); the last replica exiting with 0 completes it;
    a workload already being stopped settles once its last replica is gone.
    An `unobserved` end (the node's engine lost track of the run, so nobody
    knows how it ended) fails nothing: the attempt is requeued, up to the
    workload's requeue limit.
    """
    row = _locked_replica(workload_id, attempt, replica)
    if row is None or row.state in (ReplicaState.EXITED, ReplicaState.LOST):
        return False
    if row.state == ReplicaState.LAUNCHING and not launch_failed:
        # The exit overtook the start report (two workers took them at once): a replica that ended had
        # started, and its workload ran; the late start report then changes nothing.
        row.state, row.started_at = ReplicaState.RUNNING, timezone.now()
        row.save(update_fields=["state", "started_at"])
        if _current(row):
            _running_when_complete(row.workload)
            row.workload.refresh_from_db()
    row.state, row.exit_code, row.finished_at = ReplicaState.EXITED, exit_code, timezone.now()
    row.message = exit_message(row.message, message, exit_code)[:2000]
    row.save(update_fields=["state", "exit_code", "finished_at", "message"])
    live.publish_workload_changes([workload_id])
    workload = row.workload
    if workload.attempt == attempt:
        Allocation.all_tenants.filter(workload_id=workload_id, replica=replica, released_at__isnull=True).update(
            released_at=row.finished_at
        )
    if _current(row):
        if unobserved:
            _requeue_lost_run(workload, row)
        else:
            _outcome(workload, row, launch_failed)
    settle_workload(workload_id=workload_id)
    return True


def _requeue_lost_run(workload: Workload, row: Replica) -> None:
    """Run the workload again as a new attempt: its replica's run ended unseen by the node's engine."""
    done = requeues(workload.pk, ReasonCode.ENGINE_LOST_RUN)
    what = f"Replica {row.index} ran while node {row.node.name}'s container engine restarted, and the engine lost track"
    gang = " The other replicas are stopped." if workload.replicas > 1 else ""
    if done < workload.requeue_limit:
        target, verdict = WorkloadState.PREEMPTED, f"requeued (requeue {done + 1} of {workload.requeue_limit})"
    else:
        target, verdict = WorkloadState.FAILED, f"all {workload.requeue_limit} requeues are used"
    stop_workload(
        workload_id=workload.pk,
        from_states=_LIVE,
        to_state=target,
        reason_code=ReasonCode.ENGINE_LOST_RUN,
        message=f"{what} of it: how it ended is not known; {verdict}.{gang}",
    )


def _killed_note(row: Replica) -> str:
    """Say who killed a replica that ended by SIGKILL or SIGTERM while its workload ran: not the platform.

    The platform records its reason before it stops anything (`stopping`), so
    a killed replica of a running workload was killed by something else.
    """
    if row.exit_code not in (SIGKILL_EXIT, SIGTERM_EXIT):
        return ""
    detail = f"{row.message}; " if row.message else ""
    return f" ({detail}killed by a signal this console did not send: out of memory, or stopped from outside it)"


def _outcome(workload: Workload, row: Replica, launch_failed: bool) -> None:
    """Decide what one replica's exit means for its live workload."""
    if launch_failed or row.exit_code != 0:
        if launch_failed:
            code, what = ReasonCode.LAUNCH_FAILED, f"could not be launched: {row.message}"
        elif row.exit_code is None:
            code, what = ReasonCode.CONTAINER_VANISHED, f"ended without an exit code ({row.message})"
        else:
            code, what = ReasonCode.EXIT_NONZERO, f"exited with code {row.exit_code}{_killed_note(row)}"
        gang = " The other replicas are stopped." if workload.replicas > 1 else ""
        stop_workload(
            workload_id=workload.pk,
            from_states=_LIVE,
            to_state=WorkloadState.FAILED,
            reason_code=code,
            message=f"Replica {row.index} {what}.{gang}",
            exit_code=row.exit_code,
        )
        return
    others = Replica.all_tenants.filter(workload=workload, attempt=workload.attempt).exclude(pk=row.pk)
    if others.exclude(state=ReplicaState.EXITED).exists():
        return
    transition_workload(
        workload_id=workload.pk,
        from_states=_LIVE,
        to_state=WorkloadState.SUCCEEDED,
        reason_code=ReasonCode.EXITED,
        message="Completed: every replica exited with code 0.",
        exit_code=0,
        finished_at=timezone.now(),
    )
