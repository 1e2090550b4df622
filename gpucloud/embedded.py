"""Embedded mode: the Celery worker and beat run as threads inside the console process.

The same task functions run as in a distributed deployment; only the
transport differs (Celery's in-process `memory://` broker). Starting a full
`app.Worker` in a thread is avoided because it takes over signal handling.
"""

from __future__ import annotations

import threading
from pathlib import Path

from celery import Celery
from celery.beat import EmbeddedService
from celery.worker import WorkController

# Worker threads of each embedded worker: control work is short and mostly waits on the database; one
# ingest thread stores a node's log batches in the order they were sent; the agent's threads mostly wait
# on the runtime (a start may take minutes, a stop its grace period), so it has enough not to block a list.
CONTROL_THREADS = 4
INGEST_THREADS = 1
AGENT_THREADS = 16


def start_worker(
    app: Celery, *, queues: list[str], concurrency: int = 4, hostname: str = "embedded@localhost"
) -> WorkController:
    """Start a worker consuming `queues` on a daemon thread and return it once it is consuming."""
    ready = threading.Event()
    worker = WorkController(
        app=app,
        hostname=hostname,
        pool_cls="threads",
        concurrency=concurrency,
        queues=queues,
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        ready_callback=lambda *_: ready.set(),
        loglevel="WARNING",
    )
    threading.Thread(target=worker.start, name="embedded-worker", daemon=True).start()
    if not ready.wait(timeout=30):
        raise RuntimeError("The embedded Celery worker did not start within 30 seconds.")
    return worker


def start_workers(app: Celery, *, agent_queue: str) -> list[WorkController]:
    """Start the embedded console's workers: control, ingest and the local agent's queue, each its own threads.

    Separate workers keep the kinds of work from starving each other: a
    burst of log batches or a replica's slow start never takes the thread a
    scheduling pass or an exit report needs.
    """
    return [
        start_worker(app, queues=["control"], concurrency=CONTROL_THREADS, hostname="control@embedded"),
        start_worker(app, queues=["ingest"], concurrency=INGEST_THREADS, hostname="ingest@embedded"),
        start_worker(app, queues=[agent_queue], concurrency=AGENT_THREADS, hostname="agent@embedded"),
    ]


def start_beat(app: Celery, *, schedule_file: Path) -> threading.Thread:
    """Start Celery beat on a daemon thread, keeping its schedule state in `schedule_file`."""
    beat = EmbeddedService(app, thread=True, schedule_filename=str(schedule_file))
    assert isinstance(beat, threading.Thread)
    beat.start()
    return beat
