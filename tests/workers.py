"""Real servers for tests, in threads: a Celery worker on the configured broker, the console under uvicorn."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import uvicorn
from celery.worker import WorkController
from django.db import connections
from kombu.asynchronous import set_event_loop

from gpucloud import embedded
from gpucloud.celery import app
from gpucloud.serving import server_config


def purge(queues: list[str]) -> None:
    """Drop every message waiting on `queues` (and the app's default queues) in the broker."""
    app.control.purge()
    with app.connection_for_write() as connection:
        channel: Any = connection.default_channel
        for queue in queues:
            try:
                channel.queue_purge(queue)
            except Exception:  # noqa: S112 -- a queue nobody declared holds nothing to purge
                continue


@contextmanager
def running_worker(queues: list[str], *, concurrency: int = 1) -> Iterator[WorkController]:
    """Run a worker on `queues` for the duration of the block.

    Worker threads close their database connection after each task, so none
    outlives the test database. On Redis a worker runs kombu's event loop,
    which is global to the process and keeps the timer of the worker that
    created it: it is dropped with the worker, or the next worker of this
    process would reuse it and never run its own timers (ETAs, retries).
    """
    database = connections["default"].settings_dict
    max_age, database["CONN_MAX_AGE"] = database["CONN_MAX_AGE"], 0
    purge(queues)  # messages a crashed earlier run left behind
    worker = embedded.start_worker(app, queues=queues, concurrency=concurrency)
    try:
        yield worker
    finally:
        worker.stop(in_sighandler=False)
        set_event_loop(None)
        database["CONN_MAX_AGE"] = max_age


def wait_until(predicate: Callable[[], object], timeout: float = 15.0, *, interval: float = 0.05) -> bool:
    """Poll `predicate` every `interval` seconds until it is truthy or `timeout` seconds pass; return whether it is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


@contextmanager
def uvicorn_server(app: Any, *, port: int = 0) -> Iterator[str]:
    """Serve the ASGI `app` (lifespan included) under uvicorn on loopback for the block; yield its URL.

    `port` 0 takes a free one; a given port lets a test stop the console and start it again where clients expect it.
    """
    # The CLI's configuration (proxy headers as `gpucloud serve` treats them), so tests see what is served.
    server = uvicorn.Server(server_config(app, host="127.0.0.1", port=port, lifespan="on", log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_until(lambda: server.started, timeout=20, interval=0.02), "uvicorn did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def kill_process_sessions(work_dir: Path) -> None:
    """SIGKILL the session of every process-runtime workload under an agent's `work_dir` still alive.

    Each such workload is a session of its own: whatever Jupyter a failed test left behind goes with it.
    """
    from inventory.drivers.process._workdir import alive

    for path in work_dir.glob("*/state.json"):
        state = json.loads(path.read_text())
        if state.get("pgid") and alive(state.get("pid"), state.get("child_start")):
            with suppress(ProcessLookupError):
                os.killpg(state["pgid"], signal.SIGKILL)


def wait_for_idle_database(timeout: float = 15.0) -> bool:
    """Wait until no other session of the test database runs a statement or holds a transaction open.

    For tests whose live server may still be answering (a WebSocket closed by the client is torn down on the
    server a moment later): pytest-django's flush truncates every table, and a server query meeting it
    deadlocks. Postgres only; elsewhere (SQLite locks the whole file) returns True at once.
    """
    if connections["default"].vendor != "postgresql":
        return True
    probe = connections.create_connection("default")
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')"
    )
    try:

        def idle() -> bool:
            with probe.cursor() as cursor:
                cursor.execute(query)
                return int(cursor.fetchone()[0]) == 0

        return wait_until(idle, timeout, interval=0.1)
    finally:
        probe.close()
