"""Controller tasks of the jobs app (queue `control`): thin, named, idempotent.

A task that carries an agent's report decodes its protocol message (`common.control.decode`) before acting:
one that does not fit its message, or names a version this side does not read, raises `ProtocolError`
naming every bad field, and nothing is done (it is not retried).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from celery import Task, shared_task
from django.utils import timezone

from common import control
from common.control import INGEST_QUEUE, REPORT_RETRY, CoalescingTask, decode
from common.protocol.messages import (
    LogBatches,
    NodeReplicas,
    Reconcile,
    ReplicaCheckpointed,
    ReplicaExited,
    ReplicaPulling,
    ReplicaReady,
    ReplicaStarted,
)
from common.task_names import (
    CHECK_IDLE_NOTEBOOKS,
    CONFIRM_START_TIMEOUTS,
    ENFORCE_TIME_LIMITS,
    INGEST_LOGS,
    LAUNCH_WORKLOADS,
    PURGE_EXPIRED_LOGS,
    SCHEDULE_PASS,
    STOP_ORPHANED_WORK,
)
from jobs.scheduler.shell import run_pass
from jobs.services import checkpoints, execution, idle, logs, reconcile, replicas, revocation, watchdog


@shared_task(name=SCHEDULE_PASS, base=CoalescingTask, ignore_result=True)
def schedule_pass() -> dict[str, Any] | None:
    """Run one scheduling pass; a pass already running elsewhere makes this one return None at once."""
    result = run_pass()
    if result is None:
        return None
    return {"placed": result.placed, "preempted": result.preempted, "waiting": result.waiting}


@shared_task(name=LAUNCH_WORKLOADS, ignore_result=True, **REPORT_RETRY)
def launch_workloads(workload_ids: list[int]) -> int:
    """Launch placed workloads on their nodes (after a pass commits); return how many replicas were sent."""
    return execution.launch_workloads(workload_ids=workload_ids)


@shared_task(name=ReplicaStarted.TASK, ignore_result=True, **REPORT_RETRY)
def replica_started(**message: Any) -> bool:
    """An agent started (or adopted) a replica (`ReplicaStarted`)."""
    started = decode(ReplicaStarted, message)
    return replicas.record_replica_started(
        workload_id=started.workload_id,
        attempt=started.attempt,
        replica=started.replica,
        handle=started.handle,
        endpoint=started.endpoint,
    )


# The fields of a pull report that name its replica; the rest is its progress.
_REPLICA_FIELDS = frozenset({"workload_id", "attempt", "replica"})


@shared_task(name=ReplicaPulling.TASK, ignore_result=True, **REPORT_RETRY)
def replica_pulling(**message: Any) -> bool:
    """An agent is pulling a replica's image as part of its start, or finished (`ReplicaPulling`: its
    `PullProgress`)."""
    pulling = decode(ReplicaPulling, message)
    progress = {key: value for key, value in pulling.to_wire().items() if key not in _REPLICA_FIELDS}
    return replicas.record_replica_pulling(
        workload_id=pulling.workload_id, attempt=pulling.attempt, replica=pulling.replica, progress=progress
    )


@shared_task(name=ReplicaReady.TASK, ignore_result=True, **REPORT_RETRY)
def replica_ready(**message: Any) -> bool:
    """A notebook's Jupyter server answered its status URL (`ReplicaReady`)."""
    ready = decode(ReplicaReady, message)
    return replicas.record_replica_ready(workload_id=ready.workload_id, attempt=ready.attempt, replica=ready.replica)


@shared_task(name=ReplicaExited.TASK, ignore_result=True, **REPORT_RETRY)
def replica_exited(**message: Any) -> bool:
    """A replica ended, was stopped, or could not be launched (`ReplicaExited`; `log_cursor`: where its shipped
    output ends; `unobserved`: the node's engine lost track of its run, so how it ended is not known)."""
    exited = decode(ReplicaExited, message)
    if exited.log_cursor is not None:
        logs.record_log_end(
            workload_id=exited.workload_id, attempt=exited.attempt, replica=exited.replica, log_end=exited.log_cursor
        )
    return replicas.record_replica_exited(
        workload_id=exited.workload_id,
        attempt=exited.attempt,
        replica=exited.replica,
        exit_code=exited.exit_code,
        message=exited.message,
        launch_failed=exited.launch_failed,
        unobserved=exited.unobserved,
    )


# A batch that does not continue its replica's chain is usually early, not a duplicate: the worker runs
# several tasks at once, so the batch before it may be in another process right now. It waits for it a
# moment in place, then through retries spaced ever wider (1, 2, 4 ... 30 s: about three minutes in all)
# before it counts as a replay and is dropped. The wait in place is short on purpose: a batch whose
# predecessor was lost holds a worker process for all of it, and a replica printing ten batches a second
# would make the whole ingest queue crawl behind one gap (its second wait has the node read the output
# again, `reconcile.request_output_resends`, which fills the gap).
INGEST_WAIT_SECONDS = 0.5
INGEST_RETRIES = 9
INGEST_RETRY_CAP_SECONDS = 30.0


def _retry_countdown(retries: int) -> float:
    """Seconds before retry number `retries` (1-based) of an early batch."""
    return min(2.0 ** (retries - 1), INGEST_RETRY_CAP_SECONDS)


@shared_task(name=INGEST_LOGS, bind=True, ignore_result=True, max_retries=INGEST_RETRIES)
def ingest_logs(
    self: Task, workload_id: int, attempt: int, replica: int, since: str, cursor: str, lines: list[list[str]]
) -> int:
    """Store one chained batch of a replica's output; an out-of-order batch waits for its predecessor."""
    deadline = time.monotonic() + INGEST_WAIT_SECONDS
    while True:
        stored = logs.ingest_log_batch(
            workload_id=workload_id, attempt=attempt, replica=replica, since=since, cursor=cursor, lines=lines
        )
        if stored or not lines or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    if stored == 0 and lines and self.request.retries < INGEST_RETRIES:
        raise self.retry(countdown=_retry_countdown(self.request.retries + 1))
    return stored


@shared_task(name=LogBatches.TASK, ignore_result=True)
def ingest_log_batches(**message: Any) -> int:
    """Store a node's log batches (`LogBatches`) in order; those still out of order are retried later, a few times."""
    batches = [batch.to_wire() for batch in decode(LogBatches, message).batches]
    waiting = logs.ingest_log_batches(batches, wait_seconds=INGEST_WAIT_SECONDS)
    # Waiting a second time, a batch's predecessor is more likely lost than late (a broker can lose a
    # message a worker was taking when it died): the node reads that replica's output again.
    reconcile.request_output_resends({logs.replica_key(batch) for batch in waiting if batch.get("retries")})
    retry = [{**batch, "retries": int(batch.get("retries", 0)) + 1} for batch in waiting]
    kept = [batch for batch in retry if batch["retries"] <= INGEST_RETRIES]
    if kept:
        countdown = _retry_countdown(max(int(batch["retries"]) for batch in kept))
        ingest_log_batches.apply_async(kwargs={"batches": kept}, countdown=countdown, queue=INGEST_QUEUE)
    return len(batches) - len(waiting)


@shared_task(name=NodeReplicas.TASK, ignore_result=True, **REPORT_RETRY)
def node_replicas(**message: Any) -> dict[str, int]:
    """An agent's own view of its replicas (`NodeReplicas`: runtime list, starting, gone, unstarted): compare it
    with the ledger."""
    view = decode(NodeReplicas, message)
    return reconcile.reconcile_node(
        node=view.node,
        managed=[replica.to_wire() for replica in view.managed],
        starting=view.starting,
        gone=view.gone,
        unstarted=view.unstarted,
    )


@shared_task(name=Reconcile.TASK, base=CoalescingTask, ignore_result=True)
def reconcile_workloads(**message: Any) -> dict[str, int]:
    """Periodic, and asked by an agent (`Reconcile`): repair the ledger, ask every live node what it runs,
    handle lost nodes."""
    decode(Reconcile, message)
    counts = reconcile.reconcile_ledger(now=control.evidence_time())
    counts["lost"] = watchdog.handle_lost_nodes()
    counts["nodes_asked"] = reconcile.request_node_inventories()
    return counts


@shared_task(name=ENFORCE_TIME_LIMITS, base=CoalescingTask, ignore_result=True)
def enforce_time_limits() -> dict[str, int]:
    """Periodic: stop workloads past their maximum runtime, fail launches past the start timeout."""
    return watchdog.enforce_time_limits(now=control.evidence_time(), confirm_later=True)


@shared_task(name=CONFIRM_START_TIMEOUTS, ignore_result=True, **REPORT_RETRY)
def confirm_start_timeouts(workload_ids: list[int], cutoff: str) -> int:
    """The second pass of a start timeout: fail those still overdue once every report ahead has been applied."""
    return watchdog.fail_start_timeouts(workload_ids, cutoff=datetime.fromisoformat(cutoff))


@shared_task(name=CHECK_IDLE_NOTEBOOKS, base=CoalescingTask, ignore_result=True)
def check_idle_notebooks() -> dict[str, int]:
    """Periodic: track notebooks' activity, warn the idle ones' owners, stop those idle past their timeout."""
    return idle.check_idle_notebooks(now=timezone.now())


@shared_task(name=STOP_ORPHANED_WORK, base=CoalescingTask, ignore_result=True)
def stop_orphaned_work() -> int:
    """On a change that ended someone's access, and periodically: stop the work of owners who lost access."""
    return revocation.stop_orphaned_work()


@shared_task(name=PURGE_EXPIRED_LOGS, base=CoalescingTask, ignore_result=True)
def purge_expired_logs() -> int:
    """Periodic: delete log chunks past their tenant's retention."""
    return logs.purge_expired_logs(now=timezone.now())


@shared_task(name=ReplicaCheckpointed.TASK, ignore_result=True, **REPORT_RETRY)
def replica_checkpointed(**message: Any) -> bool:
    """A job wrote to its checkpoint directory (`ReplicaCheckpointed`; `at`: the newest file's time, epoch
    seconds, its node saw)."""
    written = decode(ReplicaCheckpointed, message)
    return checkpoints.record_checkpoint(
        workload_id=written.workload_id, attempt=written.attempt, replica=written.replica, at=written.at
    )
