"""The scheduling shell: read the ledger into a snapshot, run the pure core, commit its decisions.

A pass is one transaction:

1. take the single-flight lock (a transaction-scoped Postgres advisory lock;
   on SQLite, a process lock plus the IMMEDIATE write transaction the
   embedded settings use, since the embedded console is one process);
2. build the snapshot in a fixed number of set-based queries, whatever the
   number of workloads, nodes and GPUs;
3. run `jobs.scheduler.core.schedule` (through `jobs.scheduler.frozen`, with the collector off the snapshot);
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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from jobs.metrics import record_pass_duration
from jobs.scheduler import core, frozen
from jobs.scheduler.commit import PassResult, commit
from jobs.scheduler.snapshot import build_snapshot
from jobs.triggers import enqueue_scheduling_pass

__all__ = ["PassResult", "build_snapshot", "run_pass", "scheduler_config"]

log = logging.getLogger(__name__)

# An arbitrary 64-bit key naming the scheduler's advisory lock ("gpucloud" in ASCII).
ADVISORY_LOCK_KEY = 0x67707563_6C6F7564
_local_lock = threading.Lock()
# A pass asked for while another held the lock (see `run_pass`); the wish outlives no pass by much.
PASS_WANTED_KEY = "gpucloud:scheduler:pass-wanted"  # noqa: S105 -- a cache key, not a secret
PASS_WANTED_SECONDS = 300


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

    A pass asked for while another runs is never lost: it leaves a wish
    (`PASS_WANTED_KEY`, in the cache every process shares) and tries the
    lock once more, in case the holder finished before it could see the
    wish; a pass that ends finds the wish and asks for one more pass, which
    sees what changed while it ran (a cancellation that freed GPUs, say).
    All or nothing: an error anywhere (a double allocation refused by the
    database included) rolls the whole pass back and is raised.
    """
    result = _run_pass_once(now, config)
    if result is None:
        _leave_wish()
        result = _run_pass_once(now, config)
        if result is None:
            return None  # the holder ends after the wish was left: it asks for the pass
    if _take_wish():
        enqueue_scheduling_pass()
    return result


def _leave_wish() -> None:
    """Ask the pass that holds the lock for one more pass after it; best effort (see `_take_wish`)."""
    try:
        cache.set(PASS_WANTED_KEY, 1, timeout=PASS_WANTED_SECONDS)
    except Exception:
        log.warning("could not leave a wish for another scheduling pass (cache unavailable)", exc_info=True)


def _take_wish() -> bool:
    """Return whether a pass was wished for while this one ran, and clear the wish; never raises.

    The wish lives in the cache, which is only transport: with the cache
    down a wish is lost, never a pass or its commit, and the periodic pass
    sees whatever the lost wish was for.
    """
    try:
        return bool(cache.delete(PASS_WANTED_KEY))
    except Exception:
        log.warning("could not read the wish for another scheduling pass (cache unavailable)", exc_info=True)
        return False


def _run_pass_once(now: datetime | None, config: core.SchedulerConfig | None) -> PassResult | None:
    """Run one pass if the lock is free (released again when this returns); None when another holds it."""
    moment = now or timezone.now()
    with transaction.atomic(), _single_flight() as acquired:
        if not acquired:
            return None
        result = PassResult()
        started = time.perf_counter()
        snapshot, ledger = build_snapshot(now=moment, config=config or scheduler_config())
        built = time.perf_counter()
        decisions = frozen.schedule(snapshot)
        decided = time.perf_counter()
        commit(decisions, ledger, moment, result)
        result.timings = {
            "snapshot": built - started,
            "core": decided - built,
            "commit": time.perf_counter() - decided,
        }
    record_pass_duration(sum(result.timings.values()))
    return result


def scheduler_config() -> core.SchedulerConfig:
    """Return the core's knobs from the settings (SCHEDULER_MIN_RUNTIME_SECONDS, SCHEDULER_PREEMPTION)."""
    return core.SchedulerConfig(
        min_runtime_s=float(settings.SCHEDULER_MIN_RUNTIME_SECONDS), preemption=settings.SCHEDULER_PREEMPTION
    )
