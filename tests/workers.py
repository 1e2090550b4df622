"""A real Celery worker thread for tests, consuming through the configured broker (Redis or in-process)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from celery.worker import WorkController
from django.db import connections

from gpucloud import embedded
from gpucloud.celery import app


@contextmanager
def running_worker(queues: list[str], *, concurrency: int = 1) -> Iterator[WorkController]:
    """Run a worker on `queues` for the duration of the block.

    Worker threads close their database connection after each task, so none
    outlives the test database.
    """
    database = connections["default"].settings_dict
    max_age, database["CONN_MAX_AGE"] = database["CONN_MAX_AGE"], 0
    app.control.purge()  # messages a crashed earlier run left behind
    worker = embedded.start_worker(app, queues=queues, concurrency=concurrency)
    try:
        yield worker
    finally:
        worker.stop(in_sighandler=False)
        database["CONN_MAX_AGE"] = max_age


def wait_until(predicate: Callable[[], object], timeout: float = 15.0) -> bool:
    """Poll `predicate` every 50 ms until it is truthy or `timeout` seconds pass; return whether it became so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False
