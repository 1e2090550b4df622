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


def start_worker(app: Celery, *, queues: list[str], concurrency: int = 4) -> WorkController:
    """Start a worker consuming `queues` on a daemon thread and return it once it is consuming."""
    ready = threading.Event()
    worker = WorkController(
        app=app,
        hostname="embedded@localhost",
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


def start_beat(app: Celery, *, schedule_file: Path) -> threading.Thread:
    """Start Celery beat on a daemon thread, keeping its schedule state in `schedule_file`."""
    beat = EmbeddedService(app, thread=True, schedule_filename=str(schedule_file))
    assert isinstance(beat, threading.Thread)
    beat.start()
    return beat
