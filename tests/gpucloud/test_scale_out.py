"""Scale-out: two web and two controller worker processes on one Postgres and Redis act as one console.

The console runs as a deployment runs it, each component a real process of
its own started with the `gpucloud` command on the test database: web 1 and
web 2 (`gpucloud serve`, each on a free loopback port), worker 1 and worker
2 (`gpucloud worker`, both on the control and ingest queues), beat on its
own (`gpucloud worker --beat` on a queue nobody sends to) and the agent of
one process-runtime node (`gpucloud agent`, four simulated GPUs). The tests
submit through both web processes at once, follow a job's stream on both,
and reach a notebook's Jupyter and kernel through the proxy of either;
whichever worker takes a task, the results are those of one process.

Where a test needs the scheduler to wait, it holds the scheduler's Postgres
advisory lock itself: every pass of either worker is refused until it lets
go, which is also the proof that passes are single-flight across processes.
The processes serve the whole module; `_console_at_work` says how each
test's database flush stays clear of them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import psycopg
import pytest
from django.conf import settings
from django.core.cache.backends.redis import RedisCache
from django.db import connection
from django.test import Client
from redis import Redis
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect
from websockets.sync.connection import Connection
from websockets.typing import Subprotocol

from common.protocol.messages import LogBatches, ReplicaExited, ReplicaStarted
from common.task_names import LAUNCH_WORKLOADS, SCHEDULE_PASS
from inventory.choices import NodeState
from inventory.models import Node
from inventory.services.nodes import register_node
from inventory.services.provisioning import provision_node
from jobs import selectors
from jobs.choices import TERMINAL_STATES, WorkloadState
from jobs.models import Allocation, Replica, Workload, WorkloadEvent
from jobs.scheduler.shell import ADVISORY_LOCK_KEY, PASS_WANTED_KEY
from tenants.context import Actor
from tenants.models import ProjectQuota
from tenants.scoping import tenant_scope
from tests.conftest import World
from tests.frontend.live import token_for
from tests.jobs.factories import assign, give_quota
from tests.jobs.test_proxy import browser, execute, websocket
from tests.process_user import reachable_dir, workload_python
from tests.workers import kill_process_sessions, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
NODE = "scale-out"
GPUS = 4
WORKLOADS = "/api/v1/tenants/tenant-a/workloads/"
# The variables the console's processes get from the test alone (the test database's, not the caller's).
_OWN = ("DATABASE_URL", "DATABASE_TEST_NAME", "REDIS_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS")


# --- the deployment ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Component:
    """One process of the console, in a session of its own so that stopping it takes everything it forked."""

    name: str
    argv: list[str]
    log: Path
    ready: Callable[[Component], bool]
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        """Start `gpucloud <argv>` with `env` (and this component's own variables), its output to its log."""
        command = [sys.executable, "-c", "from gpucloud.cli import main; main()", *self.argv]
        with self.log.open("wb") as output:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env | self.env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 40) -> str:
        return f"--- {self.name} ---\n" + "\n".join(self.output().splitlines()[-lines:])

    def send(self, sig: signal.Signals) -> None:
        """Send `sig` to the whole process group."""
        if self.process is not None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)

    def wait(self, deadline: float) -> None:
        """Wait for the process to exit until `deadline` (monotonic seconds) at most."""
        if self.process is not None:
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=max(deadline - time.monotonic(), 0.01))


def _stop(components: list[Component]) -> None:
    """SIGTERM every component's process group (woken, should it be paused), SIGKILL what is left after 15 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for component in components:
            component.send(sig)
            component.send(signal.SIGCONT)
        deadline = time.monotonic() + 15
        for component in components:
            component.wait(deadline)


@dataclass
class Deployment:
    """The console's processes: two web, two controller workers, beat, and one node's agent."""

    data_dir: Path
    webs: list[str] = field(default_factory=list)
    components: list[Component] = field(default_factory=list)

    @property
    def workers(self) -> list[Component]:
        return [component for component in self.components if component.name.startswith("worker-")]

    @property
    def beat(self) -> Component:
        return next(component for component in self.components if component.name == "beat")

    @property
    def agent_work_dir(self) -> Path:
        return self.data_dir / "agent" / NODE

    def diagnostics(self) -> str:
        return "\n".join(component.tail() for component in self.components)


def _answers(base: str) -> Callable[[Component], bool]:
    def ready(_: Component) -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    return ready


def _worker_ready(component: Component) -> bool:
    return " ready." in component.output()


def _started(component: Component) -> bool:
    """Wait until `component` serves (or exits); return whether it serves."""
    wait_until(lambda: component.ready(component) or not component.alive, timeout=120, interval=0.3)
    return component.alive and component.ready(component)


def _environment(data_dir: Path) -> dict[str, str]:
    """Return the environment of every component: the test's database, Redis and secret key, a data directory."""
    database = connection.settings_dict
    user, password = quote(database["USER"] or "", safe=""), quote(database["PASSWORD"] or "", safe="")
    url = f"postgres://{user}:{password}@{database['HOST']}:{database['PORT'] or 5432}/{database['NAME']}"
    env = {k: v for k, v in os.environ.items() if k not in _OWN and not k.startswith("GPUCLOUD_")}
    env.update(
        DATABASE_URL=url,
        REDIS_URL=str(settings.REDIS_URL),
        SECRET_KEY=settings.SECRET_KEY,
        DJANGO_SETTINGS_MODULE="gpucloud.settings",
        PYTHONUNBUFFERED="1",
        GPUCLOUD_DATA_DIR=str(data_dir),
        GPUCLOUD_AGENT_PULL_IMAGES="0",
        # A small pool per process: the six share the Postgres other test runs use.
        DATABASE_POOL_SIZE="5",
        # Jupyter from the suite's own interpreter: the process runtime gives workloads a minimal PATH.
        # Run as the workload's unprivileged user when the tests run as root (tests/process_user.py).
        NOTEBOOK_COMMAND=",".join([*workload_python(), "-m", "jupyter_server"]),
    )
    return env


@pytest.fixture(scope="module")
def deployment(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Start the six processes on the test database; yield once every one of them serves."""
    data_dir = reachable_dir()  # workloads run as another user when the tests run as root
    logs = tmp_path_factory.mktemp("scale-out-logs")
    deployment = Deployment(data_dir=data_dir)
    for name in ("web-1", "web-2"):
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        deployment.webs.append(base)
        argv = ["serve", "--host", "127.0.0.1", "--port", str(port)]
        deployment.components.append(Component(name, argv, logs / f"{name}.log", _answers(base)))
    queues = ["--queues", "control,ingest", "--loglevel", "INFO"]
    # Celery logs each task a worker takes at DEBUG only: the test reads them to see both workers work.
    debug = {"LOG_LEVEL": "DEBUG"}
    deployment.components += [
        Component("worker-1", ["worker", *queues], logs / "worker-1.log", _worker_ready, debug),
        Component("worker-2", ["worker", *queues], logs / "worker-2.log", _worker_ready, debug),
        # Beat on its own, as bench/_faults/topology.py runs it: a worker of a queue nobody sends to.
        Component("beat", ["worker", "--beat", "--queues", "scale-out.beat-only"], logs / "beat.log", _worker_ready),
        Component(
            "agent",
            ["agent", "--node", NODE, "--probe", "simulated", "--simulated-gpus", str(GPUS), "--allow-process-runtime"],
            logs / "agent.log",
            _worker_ready,
            {"DATABASE_URL": ""},  # as compose/docker-compose.yml runs it: the agent never touches the database
        ),
    ]
    env = _environment(data_dir)
    try:
        for component in deployment.components:
            component.start(env)
        for component in deployment.components:
            if not _started(component):
                pytest.fail(f"{component.name} did not start within 120 s\n{deployment.diagnostics()}")
        yield deployment
    finally:
        _stop(deployment.components)
        kill_process_sessions(deployment.agent_work_dir)


def _quiet() -> bool:
    """Return whether the console does nothing now: no task waiting or taken, no statement or transaction open."""
    broker = Redis.from_url(str(settings.REDIS_URL))
    with broker:
        if broker.llen("control") or broker.llen("ingest") or broker.hlen("unacked"):
            return False
    with psycopg.connect(**_conninfo(), autocommit=True) as database:
        busy = database.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')"
        ).fetchone()
    return busy is not None and busy[0] == 0


@pytest.fixture(autouse=True)
def _console_at_work(transactional_db: None, deployment: Deployment) -> Iterator[None]:
    """Beat ticks during each test; after it, the console is brought to rest before the database is flushed.

    The flush truncates every table at once while the console's processes
    hold connections: a transaction of theirs that meets it midway deadlocks
    with it. So beat (which holds no database lock) is paused, what the test
    left running is killed, and the flush waits until no task is waiting or
    running and no transaction is open. Beat carries on in the next test.
    """
    deployment.beat.send(signal.SIGCONT)
    yield
    deployment.beat.send(signal.SIGSTOP)
    kill_process_sessions(deployment.agent_work_dir)
    calm = 0
    deadline = time.monotonic() + 60
    while calm < 5 and time.monotonic() < deadline:
        calm = calm + 1 if _quiet() else 0
        time.sleep(0.1)
    assert calm >= 5, "the console did not come to rest within 60 s\n" + deployment.diagnostics()


# --- the world every test starts from ---------------------------------------------------------------


@pytest.fixture
def node(world: World, deployment: Deployment) -> Node:
    """Alpha's quota in `shared`, member_a on alpha, and node NODE there, provisioned by the agent process."""
    give_quota(world, limit=GPUS)
    assign(world.member_a, world.project_a)
    operator = Actor(user=world.operator)
    registered = register_node(
        actor=operator, name=NODE, pool=world.pool, runtime="process", cpu_cores=64, memory_mib=512_000
    )
    provision_node(actor=operator, node=registered)
    ready = Node.objects.filter(pk=registered.pk, state=NodeState.READY)
    assert wait_until(ready.exists, timeout=60, interval=0.2), deployment.diagnostics()
    node = Node.objects.get(pk=registered.pk)
    assert node.gpus.count() == GPUS
    return node


@pytest.fixture
def secret(world: World) -> str:
    """An API token of member_a in tenant A."""
    return token_for(world.member_a, world.tenant_a, "member")


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _post(base: str, secret: str, key: str | None = None, **body: Any) -> httpx.Response:
    """Send a submission to alpha (with Idempotency-Key `key`) to the web process at `base`; return its answer."""
    payload = {"project": "alpha", "pool": "shared", "image": "registry.example.com/python:3", **body}
    headers = _bearer(secret) | ({"Idempotency-Key": key} if key else {})
    return httpx.post(f"{base}{WORKLOADS}", json=payload, headers=headers, timeout=30)


def _submit(base: str, secret: str, **body: Any) -> int:
    """Submit a workload to alpha through the web process at `base`; return its id."""
    response = _post(base, secret, **body)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def _race(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Make `calls` at the same moment, a thread each; return their answers in order."""
    start = threading.Barrier(len(calls))

    def call(index: int) -> httpx.Response:
        start.wait(timeout=30)
        return calls[index]()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(call, range(len(calls))))


def _python(script: str, *args: str) -> list[str]:
    return [*workload_python(), "-c", textwrap.dedent(script), *args]


def _conninfo() -> dict[str, Any]:
    database = connection.settings_dict
    return {
        "dbname": database["NAME"],
        "user": database["USER"],
        "password": database["PASSWORD"],
        "host": database["HOST"],
        "port": database["PORT"] or 5432,
    }


@contextmanager
def scheduler_held() -> Iterator[Callable[[], bool]]:
    """Hold the scheduler's advisory lock for the block, on a connection of its own (closing it lets go).

    Yields `refused`: it waits until a pass of the console's workers meets the
    lock after this call, and returns whether one did. A refused pass leaves
    its wish in the cache the console's processes share (jobs/scheduler/shell.py).
    """
    console_cache = RedisCache(str(settings.REDIS_URL), {})  # the test's own cache has a prefix of its own

    def refused() -> bool:
        console_cache.delete(PASS_WANTED_KEY)
        return wait_until(lambda: console_cache.get(PASS_WANTED_KEY) is not None, timeout=30, interval=0.1)

    with psycopg.connect(**_conninfo(), autocommit=True) as held:
        held.execute("SET statement_timeout = '60s'")
        held.execute("SELECT pg_advisory_lock(%s)", [ADVISORY_LOCK_KEY])
        yield refused
        held.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_LOCK_KEY])


def _workloads(ids: list[int]) -> list[Workload]:
    return list(Workload.all_tenants.filter(pk__in=ids).order_by("pk"))


def _state(workload_id: int) -> str:
    return str(Workload.all_tenants.get(pk=workload_id).state)


def _tasks_received(worker: Component) -> set[str]:
    """Return the names of the tasks `worker` took (logged at DEBUG: see `deployment`)."""
    return set(re.findall(r"Task ([\w.]+)\[[-0-9a-f]+\] received", worker.output()))


def _story(workload_id: int) -> str:
    events = WorkloadEvent.all_tenants.filter(workload_id=workload_id).order_by("pk")
    return f"workload {workload_id}: " + "; ".join(f"{e.to_state} {e.message}" for e in events)


# --- submissions and passes -------------------------------------------------------------------------

# Tasks a worker takes for one workload: its launch, the agent's reports, its output.
WORKLOAD_TASKS = {LAUNCH_WORKLOADS, ReplicaStarted.TASK, ReplicaExited.TASK, LogBatches.TASK}
JOBS = 20
# A job this short may end before its start is recorded: two workers can take the agent's start and exit
# reports at the same time, and the exit commit first (starting -> succeeded, without "running").
# Every job passes through running, even when its exit report is applied before its start report
# (jobs.services.replicas.record_replica_exited counts such an exit as a start).
PATH = ["pending", "scheduled", "starting", "running", "succeeded"]
LINES = 20
PRINT_LINES = f"""
for i in range({LINES}):
    print(f"line {{i}}", flush=True)
"""


def test_two_workers_on_one_host_have_names_of_their_own(deployment: Deployment) -> None:
    """Celery tells workers apart by name (remote control, recovery of what a stopped worker held, its logs):
    `gpucloud worker` gives each its own, where Celery's default would call both celery@host."""
    names = {match.group(1) for w in deployment.workers if (match := re.search(r"(\S+@\S+) ready\.", w.output()))}
    assert len(names) == 2, names


def test_submissions_through_both_web_processes_run_once_each_without_sharing_a_gpu(
    world: World, node: Node, secret: str, deployment: Deployment
) -> None:
    with scheduler_held() as refused:
        with ThreadPoolExecutor(max_workers=4) as pool:
            webs = [deployment.webs[i % 2] for i in range(JOBS)]
            command = _python(PRINT_LINES)
            ids = list(pool.map(lambda i: _submit(webs[i], secret, name=f"job-{i}", command=command), range(JOBS)))
        # Beat and every submission ask for passes; while the lock is held elsewhere, neither worker places.
        assert refused(), "no pass met the held lock within 30 s\n" + deployment.diagnostics()
        assert not Allocation.all_tenants.exists()
        assert {w.state for w in _workloads(ids)} == {WorkloadState.PENDING}

    shared: list[list[int]] = []

    def finished() -> bool:
        held = list(Allocation.all_tenants.filter(released_at__isnull=True).values_list("gpu_id", flat=True))
        if len(held) != len(set(held)) or len(held) > GPUS:
            shared.append(held)
        return all(w.state in TERMINAL_STATES for w in _workloads(ids))

    assert wait_until(finished, timeout=150, interval=0.1), "\n".join(map(_story, ids)) + deployment.diagnostics()
    assert not shared, f"GPUs held by two workloads at once, or more than the node has: {shared}"
    for worker in deployment.workers:
        done = _tasks_received(worker)
        assert SCHEDULE_PASS in done and done & WORKLOAD_TASKS, f"{worker.name} took no part: {done}"
    assert wait_until(lambda: all(w.log_seq >= LINES for w in _workloads(ids)), timeout=30)
    for workload in _workloads(ids):
        assert (workload.state, workload.exit_code, workload.attempt) == (WorkloadState.SUCCEEDED, 0, 1)
        states = WorkloadEvent.all_tenants.filter(workload=workload).order_by("pk").values_list("to_state", flat=True)
        assert list(states) == PATH, _story(workload.pk)
        allocations = Allocation.all_tenants.filter(workload=workload)
        assert len(allocations) == 1 and allocations[0].released_at is not None, "placed exactly once"
        assert Replica.all_tenants.filter(workload=workload).count() == 1, "launched exactly once"
        with tenant_scope(world.tenant_a):
            lines = list(selectors.iter_log_lines(workload))
        assert [line["text"] for line in lines] == [f"line {i}" for i in range(LINES)], "every line once, in order"
        assert [line["seq"] for line in lines] == list(range(1, LINES + 1))


def test_racing_submissions_through_both_web_processes_hold_the_pending_limit(
    world: World, node: Node, secret: str, deployment: Deployment
) -> None:
    ProjectQuota.all_tenants.filter(project=world.project_a).update(max_pending_workloads=5)
    with scheduler_held():  # what stays pending counts
        answers = _race([partial(_post, deployment.webs[i % 2], secret, name=f"race-{i}") for i in range(12)])
    assert sorted(answer.status_code for answer in answers) == [201] * 5 + [400] * 7, [a.text for a in answers]
    refusals = {a.json()["error"]["fields"]["project"][0]["code"] for a in answers if a.status_code == 400}
    assert refusals == {"max_pending_workloads"}
    assert Workload.all_tenants.count() == 5


def test_a_retry_racing_its_first_attempt_on_the_other_web_process_replays_it(
    node: Node, secret: str, deployment: Deployment
) -> None:
    keys = [f"key-{i}" for i in range(6)]
    answers = _race([partial(_post, web, secret, key=key, name=key) for key in keys for web in deployment.webs])
    for key, first, again in zip(keys, answers[::2], answers[1::2], strict=True):
        assert sorted((first.status_code, again.status_code)) == [200, 201], (key, first.text, again.text)
        assert first.json()["id"] == again.json()["id"]
    assert sorted(str(w.idempotency_key) for w in Workload.all_tenants.all()) == keys


# --- live streams -----------------------------------------------------------------------------------

# Prints its lines once `go` exists, exits once `stop` does (and on its own after two minutes).
WAITS_FOR_FILES = """
import pathlib, sys, time
go, stop = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
deadline = time.monotonic() + 120
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
for i in range(5):
    print(f"live {i}", flush=True)
while not stop.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def _stream(base: str, path: str, secret: str) -> ClientConnection:
    """Open the live stream `path` on the web process at `base` with an API token, as a non-browser client does."""
    url = base.replace("http://", "ws://", 1) + path
    return ws_connect(
        url,
        additional_headers=_bearer(secret),
        subprotocols=[Subprotocol("gpucloud.v1")],
        open_timeout=30,
    )


def _read_until(stream: Connection, done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    """Return the stream's messages up to the first that makes `done` true; fails after 60 s without it."""
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while not done(messages):
        try:
            messages.append(json.loads(stream.recv(timeout=max(deadline - time.monotonic(), 0.01))))
        except TimeoutError:
            pytest.fail(f"the stream sent only {messages}")
    return messages


def _states(messages: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    return [(m["state"], m["ended"]) for m in messages if m["type"] == "state"]


def _lines(messages: list[dict[str, Any]]) -> list[list[Any]]:
    return [line for m in messages if m["type"] == "lines" for line in m["lines"]]


def test_streams_on_both_web_processes_follow_a_job_submitted_through_one_and_run_by_any_worker(
    node: Node, secret: str, deployment: Deployment
) -> None:
    shared = reachable_dir()  # the job reads these as its own user
    go, stop = shared / "go", shared / "stop"
    web_1, web_2 = deployment.webs
    with ExitStack() as streams:
        with scheduler_held():
            job = _submit(web_1, secret, name="live", command=_python(WAITS_FOR_FILES, str(go), str(stop)))
            path = f"/ws/workloads/{job}/logs/"
            watchers = [streams.enter_context(_stream(web, path, secret)) for web in (web_2, web_1)]
            for watcher in watchers:
                opening = _read_until(watcher, lambda m: bool(_states(m)))
                assert opening == [
                    {"type": "lines", "snapshot": True, "lines": []},
                    {"type": "state", "state": "pending", "ended": False},
                ]
        # The lock is let go: a worker places the job, a worker launches it, the agent starts it.
        for watcher in watchers:
            states = _states(_read_until(watcher, lambda m: ("running", False) in _states(m)))
            assert {"scheduled", "starting"} >= {state for state, _ in states[:-1]}, states
        go.touch()
        for watcher in watchers:
            messages = _read_until(watcher, lambda m: len(_lines(m)) >= 5)
            assert not _states(messages), "every line arrives while the job still runs"
            lines = _lines(messages)
            assert [(line[0], line[3]) for line in lines] == [(i + 1, f"live {i}") for i in range(5)]
        stop.touch()
        for watcher in watchers:
            messages = _read_until(watcher, lambda m: ("succeeded", True) in _states(m))
            assert not _lines(messages), "no line twice"


# --- the notebook proxy -----------------------------------------------------------------------------


def test_the_proxy_of_either_web_process_reaches_a_notebook_and_its_kernel(
    world: World, node: Node, secret: str, deployment: Deployment
) -> None:
    web_1, web_2 = deployment.webs
    notebook = _submit(web_1, secret, name="nb", kind="notebook")
    assert wait_until(lambda: _state(notebook) != WorkloadState.PENDING, timeout=30), _story(notebook)
    assert wait_until(lambda: _state(notebook) == WorkloadState.RUNNING, timeout=90), _story(notebook)
    with browser(web_1, world.member_a, notebook) as on_1, browser(web_2, world.member_a, notebook) as on_2:
        for owner in (on_1, on_2):
            status = owner.get(f"/notebooks/{notebook}/api/status")
            assert status.status_code == 200 and "started" in status.json(), status.text
        # Each web process serves the notebook origin on its next port; without the hand-off's cookie: 404.
        notebooks_2 = str(on_2.base_url).rstrip("/")
        assert httpx.get(f"{notebooks_2}/notebooks/{notebook}/api/status", timeout=30).status_code == 404
        # A ticket issued by web 1 is spent on web 2: once, across processes (the shared Redis cache).
        login = Client()
        login.force_login(world.member_a)
        session = {settings.SESSION_COOKIE_NAME: login.cookies[settings.SESSION_COOKIE_NAME].value}
        handed = httpx.get(f"{web_1}/notebooks/{notebook}/open", cookies=session, timeout=30)
        entry = urlsplit(handed.headers["location"])
        at_2 = f"{str(on_2.base_url).rstrip('/')}{entry.path}?{entry.query}"
        assert httpx.get(at_2, timeout=30).status_code == 303
        assert httpx.get(handed.headers["location"], timeout=30).status_code == 404, "spent on web 2"
        # A kernel started through web 1, computing over a WebSocket through web 2.
        kernel = on_1.post(f"/notebooks/{notebook}/api/kernels", json={"name": "python3"})
        assert kernel.status_code == 201, kernel.text
        channels = f"/notebooks/{notebook}/api/kernels/{kernel.json()['id']}/channels"
        with websocket(web_2, on_2, channels) as connection:
            assert execute(connection, "6 * 7") == "42"
        cancelled = httpx.post(f"{web_2}{WORKLOADS}{notebook}/cancel/", headers=_bearer(secret), timeout=30)
        assert cancelled.status_code == 200, cancelled.text
        held = Allocation.all_tenants.filter(workload_id=notebook, released_at__isnull=True)
        assert wait_until(lambda: not held.exists(), timeout=60), _story(notebook)
        for owner in (on_1, on_2):
            assert owner.get(f"/notebooks/{notebook}/api/status").status_code == 404, "gone from every proxy"
