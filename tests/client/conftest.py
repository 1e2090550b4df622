"""Fixtures of the client's integration tests: the real console, a real agent, and `gpc` run as a user runs it.

The console (HTTP and WebSockets) serves from this process under uvicorn, on a port it keeps across a
restart (`Console.restart`: how a test drops every live connection for real). The controller's worker and
the agent of node `cli-local` run in this process too, with the process runtime: the commands workloads
name (`sh -c ...`, JupyterLab from this venv) really run. `gpc` is the installed console script, run as a
separate process with a contexts file of its own and an API token made by the console's token service.
Nothing here depends on the mode: SQLite and the in-process broker, or Postgres and Redis from the env.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from common.origins import parse_origin_pattern
from inventory.agent import executor as executor_module
from inventory.agent.config import AgentConfig, activate
from inventory.drivers.simulated import simulated_uuid
from inventory.models import Gpu, agent_queue_for
from jobs.models import Workload, WorkloadEvent
from jobs.triggers import enqueue_scheduling_pass
from tenants.context import Actor
from tenants.services.tokens import create_token
from tests.conftest import World
from tests.frontend import live
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota
from tests.process_user import workload_python
from tests.workers import kill_process_sessions, running_worker, wait_until

NODE = "cli-local"
GPUS = 2
GPU_MODEL = "NVIDIA H100 80GB HBM3"
GPC = Path(sys.executable).with_name("gpc")  # the console script installed beside this interpreter
COMMAND_TIMEOUT = 60.0
PASS_SECONDS = 1.0  # the periodic pass, as beat asks for it (a triggered pass meeting a running one is dropped)
# What gpc would read from the test's own environment: another console or token, a display to open a browser on.
UNSET_PREFIXES = ("GPUCLOUD_", "DISPLAY", "WAYLAND_DISPLAY", "BROWSER")
fresh_live_layer = live.fresh_live_layer


class Console:
    """The console's ASGI application under uvicorn in a thread, on one loopback port for its whole life.

    `streams` records every WebSocket opened, as its access log would: path and query string.
    """

    def __init__(self, app: Any) -> None:
        self.application = app
        self.streams: list[str] = []
        self.port = 0  # the first start picks a free port; restarts bind the same one again
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Serve until `stop`; raises AssertionError when uvicorn does not listen within 20 s."""
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            lifespan="on",
            log_level="warning",
            interface="asgi3",
            ws="websockets-sansio",
        )
        self._server = server = uvicorn.Server(config)
        self._thread = thread = threading.Thread(target=server.run, name="console", daemon=True)
        thread.start()
        assert wait_until(lambda: server.started or not thread.is_alive(), timeout=20, interval=0.02)
        assert server.started, f"uvicorn did not listen on port {self.port}"
        self.port = server.servers[0].sockets[0].getsockname()[1]

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The console's application, noting each WebSocket's path and query on its way in."""
        if scope["type"] == "websocket":
            self.streams.append(f"{scope['path']}?{scope['query_string'].decode()}")
        await self.application(scope, receive, send)

    def stop(self) -> None:
        """Shut down as uvicorn does on SIGTERM: stop listening, close every connection (WebSockets: 1012)."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=15)
            assert not self._thread.is_alive(), "uvicorn did not shut down within 15 s"
        self._server = self._thread = None

    def restart(self) -> None:
        """Stop, then serve again on the same port: every open connection is dropped on the way."""
        self.stop()
        self.start()


@pytest.fixture(scope="module")
def console() -> Iterator[Console]:
    from gpucloud.asgi import application

    served = Console(application)
    served.start()
    try:
        yield served
    finally:
        served.stop()


@dataclass
class Gpc:
    """`gpc` as one user runs it: their own contexts file, nothing of the test's environment that gpc reads."""

    config: Path
    secrets: list[str] = field(default_factory=list)  # what must never appear in anything gpc prints

    def env(self, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(UNSET_PREFIXES)}
        return {**base, "GPUCLOUD_CONFIG": str(self.config), "NO_COLOR": "1", "COLUMNS": "200", **extra}

    def argv(self, *args: str) -> list[str]:
        return [str(GPC), *args]

    def __call__(
        self, *args: str, stdin: str | None = None, timeout: float = COMMAND_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """Run `gpc ARGS` to its end; return it (exit code, stdout, stderr), checked to print no secret."""
        done = subprocess.run(
            self.argv(*args), input=stdin, capture_output=True, text=True, timeout=timeout, env=self.env(), check=False
        )
        self.check_secrets(done.stdout + done.stderr)
        return done

    def check_secrets(self, printed: str) -> None:
        leaked = [secret[:12] for secret in self.secrets if secret in printed]
        assert not leaked, f"gpc printed a token: {leaked}"

    def login(self, url: str, token: str, *extra: str) -> subprocess.CompletedProcess[str]:
        """Log in with `token` read from stdin, as `gpc login URL --token-stdin`."""
        self.secrets.append(token)
        done = self("login", url, "--token-stdin", *extra, stdin=f"{token}\n")
        assert done.returncode == 0, done.stderr
        return done


def new_token(user: Any, tenant: Any, name: str = "laptop") -> str:
    """Return the secret of a fresh API token of `user` in `tenant`, made by the console's token service."""
    return create_token(actor=Actor(user=user), tenant=tenant, name=name, expires_in_days=7).secret


@dataclass
class Platform:
    """What a test starts from: the personas, the console, the agent's settings, member_a's gpc and token."""

    world: World
    console: Console
    agent: AgentConfig
    member: Gpc
    member_token: str

    @property
    def url(self) -> str:
        return self.console.url


@pytest.fixture
def platform(
    transactional_db: None,
    world: World,
    console: Console,
    tmp_path: Path,
    workload_tmp: Path,
    settings: Any,
    fresh_live_layer: None,
) -> Iterator[Platform]:
    """Node `cli-local` (process runtime, 2 GPUs whose agent samples simulated metrics), alpha's quota, member_a
    on alpha and logged in with `gpc`, the controller's worker and the agent in this process.

    Every workload process still alive at the end is killed: each is a session of its own.
    """
    settings.NOTEBOOK_COMMAND = [*workload_python(), "-m", "jupyterlab"]
    # Notebooks on their own origin: the same server under another host name, told apart by the Host header.
    settings.NOTEBOOK_ORIGIN = parse_origin_pattern(console.url.replace("127.0.0.1", "localhost"))
    give_quota(world, limit=4)
    assign(world.member_a, world.project_a)
    node = make_node(
        Actor(user=world.operator), world.pool, name=NODE, runtime="process", cpu_cores=16, memory_mib=64_000
    )
    for index in range(GPUS):
        # The simulated probe's own UUIDs, so that its samples are the ones of these GPUs.
        Gpu.objects.create(node=node, index=index, uuid=simulated_uuid(NODE, index), model=GPU_MODEL)
    work_dir = workload_tmp / "agent"
    config = AgentConfig(
        node=NODE, work_dir=work_dir, process_enabled=True, probe="simulated", simulated_gpu_count=GPUS
    )
    activate(config)
    executor_module._executor = executor_module.Executor(config)
    token = new_token(world.member_a, world.tenant_a)
    member = Gpc(tmp_path / "member" / "config.yaml")
    try:
        with running_worker(["control", "ingest", agent_queue_for(NODE)], concurrency=4), periodic_passes():
            member.login(console.url, token, "--project", "alpha")
            yield Platform(world=world, console=console, agent=config, member=member, member_token=token)
    finally:
        executor_module._executor = None
        kill_process_sessions(work_dir)


@contextmanager
def periodic_passes(seconds: float = PASS_SECONDS) -> Iterator[None]:
    """Ask for a scheduling pass every `seconds` for the block, as the console's beat does.

    A pass triggered (by a submission, a release) while another runs finds the lock held and does nothing:
    the console counts on the periodic one, which these tests run no beat for.
    """
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(seconds):
            enqueue_scheduling_pass()

    thread = threading.Thread(target=tick, name="periodic-passes", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def reached(workload_id: int, *states: str, timeout: float = 45.0) -> Workload:
    """Return the workload once it is in one of `states`; fails with its events when it does not get there."""

    def current() -> str:
        return Workload.all_tenants.get(pk=workload_id).state

    assert wait_until(lambda: current() in states, timeout=timeout, interval=0.1), (
        f"workload {workload_id} stayed {current()}; events: "
        + "; ".join(f"{e.to_state} {e.message}" for e in WorkloadEvent.all_tenants.filter(workload_id=workload_id))
    )
    return Workload.all_tenants.get(pk=workload_id)
