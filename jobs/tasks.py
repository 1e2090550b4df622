"""Controller tasks of the jobs app (queue `control`): thin, named, idempotent."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from celery import Task, shared_task
from django.utils import timezone

from common import control
from common.control import INGEST_QUEUE, REPORT_RETRY, CoalescingTask
from jobs.scheduler.shell import run_pass
from jobs.services import checkpoints, execution, idle, logs, reconcile, replicas, watchdog


@shared_task(name="jobs.schedule_pass", base=CoalescingTask, ignore_result=True)
def schedule_pass() -> dict[str, Any] | None:
    """Run one scheduling pass; a pass already running elsewhere makes this one return None at once."""
    result = run_pass()
    if result is None:
        return None
    return {"placed": result.placed, "preempted": result.preempted, "waiting": result.waiting}


@shared_task(name="jobs.launch_workloads", ignore_result=True, **REPORT_RETRY)
def launch_workloads(workload_ids: list[int]) -> int:
    """Launch placed workloads on their nodes (after a pass commits); return how many replicas were sent."""
    return execution.launch_workloads(workload_ids=workload_ids)


@shared_task(name="jobs.replica_started", ignore_result=True, **REPORT_RETRY)
def replica_started(workload_id: int, attempt: int, replica: int, handle: dict[str, Any], endpoint: str = "") -> bool:
    """An agent started (or adopted) a replica."""
    return replicas.record_replica_started(
        workload_id=workload_id, attempt=attempt, replica=replica, handle=handle, endpoint=endpoint
    )


@shared_task(name="jobs.replica_pulling", ignore_result=True, **REPORT_RETRY)
def replica_pulling(workload_id: int, attempt: int, replica: int, **progress: Any) -> bool:
    """An agent is pulling a replica's image as part of its start, or finished (`progress`: its `PullProgress`)."""
    return replicas.record_replica_pulling(workload_id=workload_id, attempt=attempt, replica=replica, progress=progress)


@shared_task(name="jobs.replica_ready", ignore_result=True, **REPORT_RETRY)
def replica_ready(workload_id: int, attempt: int, replica: int) -> bool:
    """A notebook's Jupyter server answered its status URL."""
    return replicas.record_replica_ready(workload_id=workload_id, attempt=attempt, replica=replica)


@shared_task(name="jobs.replica_exited", ignore_result=True, **REPORT_RETRY)
def replica_exited(
    workload_id: int,
    attempt: int,
    replica: int,
    exit_code: int | None,
    message: str = "",
    launch_failed: bool = False,
    log_cursor: str | None = None,
    unobserved: bool = False,
) -> bool:
    """A replica ended, was stopped, or could not be launched (`log_cursor`: where its shipped output ends).

    `unobserved`: the node's engine lost track of its run, so how it ended is not known.
    """
    if log_cursor is not None:
        logs.record_log_end(workload_id=workload_id, attempt=attempt, replica=replica, log_end=log_cursor)
    return replicas.record_replica_exited(
        workload_id=workload_id,
        attempt=attempt,
        replica=replica,
        exit_code=exit_code,
        message=message,
        launch_failed=launch_failed,
        unobserved=unobserved,
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


@shared_task(name="jobs.ingest_logs", bind=True, ignore_result=True, max_retries=INGEST_RETRIES)
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


@shared_task(name="jobs.ingest_log_batches", ignore_result=True)
def ingest_log_batches(batches: list[dict[str, Any]]) -> int:
    """Store a node's log batches in order; those still out of order are retried later, a few times."""
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


@shared_task(name="jobs.node_replicas", ignore_result=True, **REPORT_RETRY)
def node_replicas(
    node: str,
    managed: list[dict[str, Any]],
    starting: list[str] | None = None,
    gone: list[str] | None = None,
    unstarted: list[str] | None = None,
) -> dict[str, int]:
    """An agent's own view of its replicas (runtime list, starting, gone, unstarted): compare it with the ledger."""
    return reconcile.reconcile_node(node=node, managed=managed, starting=starting, gone=gone, unstarted=unstarted)


@shared_task(name="jobs.reconcile", base=CoalescingTask, ignore_result=True)
def reconcile_workloads() -> dict[str, int]:
    """Periodic: repair the ledger, ask every live node what it runs, handle lost nodes."""
    counts = reconcile.reconcile_ledger(now=control.evidence_time())
    counts["lost"] = watchdog.handle_lost_nodes()
    counts["nodes_asked"] = reconcile.request_node_inventories()
    return counts


@shared_task(name="jobs.enforce_time_limits", base=CoalescingTask, ignore_result=True)
def enforce_time_limits() -> dict[str, int]:
    """Periodic: stop workloads past their maximum runtime, fail launches past the start timeout."""
    return watchdog.enforce_time_limits(now=control.evidence_time(), confirm_later=True)


@shared_task(name="jobs.confirm_start_timeouts", ignore_result=True, **REPORT_RETRY)
def confirm_start_timeouts(workload_ids: list[int], cutoff: str) -> int:
    """The second pass of a start timeout: fail those still overdue once every report ahead has been applied."""
    return watchdog.fail_start_timeouts(workload_ids, cutoff=datetime.fromisoformat(cutoff))


@shared_task(name="jobs.check_idle_notebooks", base=CoalescingTask, ignore_result=True)
def check_idle_notebooks() -> dict[str, int]:
    """Periodic: track notebooks' activity, warn the idle ones' owners, stop those idle past their timeout."""
    return idle.check_idle_notebooks(now=timezone.now())


@shared_task(name="jobs.purge_expired_logs", base=CoalescingTask, ignore_result=True)
def purge_expired_logs() -> int:
    """Periodic: delete log chunks past their tenant's retention."""
    return logs.purge_expired_logs(now=timezone.now())


@shared_task(name="jobs.replica_checkpointed", ignore_result=True, **REPORT_RETRY)
def replica_checkpointed(workload_id: int, attempt: int, replica: int, at: float) -> bool:
    """A job wrote to its checkpoint directory; `at` is the newest file's time (epoch seconds) its node saw."""
    return checkpoints.record_checkpoint(workload_id=workload_id, attempt=attempt, replica=replica, at=at)
