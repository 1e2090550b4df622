"""Embedded mode: the Celery worker and beat run as threads inside the console process.

The same task functions run as in a distributed deployment; only the
transport differs (Celery's in-process `memory://` broker). Starting a full
`app.Worker` in a thread is avoided because it takes over signal handling.

It also decides how this machine serves as node `local` (`plan_local_node`):
the docker runtime with a notebook image built from this host's own files
when a Docker Engine answers, else the process runtime.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
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


DOCKER_INFO_TIMEOUT = 15
IMAGE_BUILD_TIMEOUT = 600
BUILD_SCRIPT = Path(".ci") / "build-notebook-image"


@dataclass(frozen=True)
class LocalNodePlan:
    """How this machine serves as a node: `runtime` docker or process, or None (not registered), and why."""

    runtime: str | None
    why: str
    image: str = ""

    @property
    def notebook_command(self) -> list[str]:
        """The Jupyter command notebooks on this node run: the image's python3, or this very interpreter."""
        return ["python3", "-m", "jupyterlab"] if self.runtime == "docker" else [sys.executable, "-m", "jupyterlab"]


def docker_problem() -> str | None:
    """Return why no Docker Engine answers here (no docker CLI, `docker info` fails), or None when one does."""
    cli = shutil.which("docker")
    if cli is None:
        return "no docker command"
    try:
        # The CLI honours DOCKER_HOST as the agent's SDK does: the same engine answers both.
        result = subprocess.run(  # noqa: S603 -- a fixed command, no shell
            [cli, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=DOCKER_INFO_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return f"`docker info` did not answer within {DOCKER_INFO_TIMEOUT} s"
    if result.returncode != 0:
        return "`docker info` failed: " + (result.stderr.strip().splitlines() or ["no output"])[-1]
    return None


def build_notebook_image(image: str, *, root: Path) -> str | None:
    """Build `image` from this host's Python and the console's JupyterLab (nothing is pulled); return why not, or None.

    Runs `.ci/build-notebook-image` of the checkout at `root`, which does
    nothing when the image exists. Only a checkout has the script, and only
    a Debian-like host with Python 3.11 can fill the image.
    """
    script = root / BUILD_SCRIPT
    if not script.is_file():
        return f"no {BUILD_SCRIPT} here (not a checkout)"
    environ = {**os.environ, "VENV_PYTHON": sys.executable}
    try:
        result = subprocess.run(  # noqa: S603 -- the checkout's own script, no shell
            [str(script), image], capture_output=True, text=True, timeout=IMAGE_BUILD_TIMEOUT, env=environ
        )
    except subprocess.TimeoutExpired:
        return f"building {image} took more than {IMAGE_BUILD_TIMEOUT} s"
    if result.returncode != 0:
        return f"building {image} failed: " + (result.stderr.strip().splitlines() or ["no output"])[-1]
    return None


def plan_local_node(mode: str, *, process_allowed: bool, image: str, root: Path) -> LocalNodePlan:
    """Decide how this machine serves as a node for `mode` (auto, docker, process or off).

    `auto` takes docker when an engine answers and the notebook image could
    be built (or exists), else the process runtime when `process_allowed`
    (GPUCLOUD_AGENT_PROCESS_RUNTIME not set to off). May take a few seconds:
    it asks the engine and may build the image.
    """
    if mode == "off":
        return LocalNodePlan(None, "GPUCLOUD_LOCAL_NODE=off")
    problem = None
    if mode in ("auto", "docker"):
        problem = docker_problem() or build_notebook_image(image, root=root)
        if problem is None:
            return LocalNodePlan("docker", f"Docker Engine, notebook image {image} built on this machine", image)
    if mode in ("auto", "process") and process_allowed:
        return LocalNodePlan("process", "process runtime: NOT isolated, for development only")
    if mode == "process":
        return LocalNodePlan(None, "GPUCLOUD_AGENT_PROCESS_RUNTIME is off, so the process runtime is not allowed")
    return LocalNodePlan(None, problem or "no runtime available")


def default_notebook_origin(host: str, port: int, allowed_hosts: list[str]) -> str | None:
    """Return the notebook origin a console on loopback `host`:`port` serves by default: the next port.

    None when the console is reached by other names (then NOTEBOOK_ORIGIN
    must be set: only the operator knows the apps domain).
    """
    from gpucloud.env import loopback_only

    if not loopback_only([host]) or not loopback_only(allowed_hosts):
        return None
    shown = "127.0.0.1" if host in ("localhost", "") else host
    shown = f"[{shown}]" if ":" in shown and not shown.startswith("[") else shown
    return f"http://{shown}:{port + 1}"


def notebook_socket(host: str, port: int) -> socket.socket | None:
    """Return a socket bound to the notebook origin's port when this process must serve it too, else None.

    That is when the origin is plain http on a port of its own: on loopback
    (`gpucloud up`: the origin's own address), or a lab's console on
    `--host 0.0.0.0` with `NOTEBOOK_ORIGIN=http://name:8001` (the console's
    bind address). Behind a reverse proxy (https, or http's default port)
    the apps host is routed to the console's own port and told apart by its
    Host header. Raises SystemExit naming the problem when the notebook
    origin is unset or is the console's own.
    """
    from django.conf import settings

    from jobs.checks import notebook_origin_errors

    problems = notebook_origin_errors()
    pattern = settings.NOTEBOOK_ORIGIN
    loopback = pattern is not None and (pattern.host in ("localhost", "[::1]") or pattern.host.startswith("127."))
    if pattern is not None and loopback and pattern.port == port:
        problems.append(f"NOTEBOOK_ORIGIN={pattern} is the console's own address: give notebooks another port.")
    if problems:
        raise SystemExit("\n".join(problems))
    assert pattern is not None
    if pattern.port == port or not (loopback or (pattern.scheme == "http" and pattern.port != 80)):
        return None
    address = pattern.host.strip("[]") if loopback else host
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, pattern.port))
    except OSError as error:
        sock.close()
        raise SystemExit(
            f"Cannot serve notebooks on {pattern} ({error}); set NOTEBOOK_ORIGIN to a free port."
        ) from None
    sock.set_inheritable(True)
    return sock
