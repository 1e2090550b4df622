"""A GPU host joins for real: a separate agent process with no SECRET_KEY, database or Redis of the console.

The console runs under uvicorn with its controller worker; the agent is
`gpucloud agent join URL TOKEN` in a child process whose environment holds
none of the console's secrets. It exchanges the token, provisions the node
to ready through the gateway, runs a job placed on it (process runtime) and
ships its output and exit; the job ends succeeded with every line stored.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inventory import tasks as inventory_tasks
from inventory.choices import NodeState
from inventory.models import Gpu, Node
from inventory.services import agents, register_node
from jobs.choices import WorkloadState
from jobs.models import LogChunk, Workload
from jobs.tasks import reconcile_workloads
from tests.conftest import World, actor
from tests.jobs.factories import assign, give_quota, run_pass_now
from tests.jobs.test_execution import _submit
from tests.workers import kill_process_sessions, running_worker, uvicorn_server, wait_until

NODE = "joined-host"
SECRETS = ("SECRET_KEY", "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")


@pytest.fixture
def console() -> Iterator[str]:
    from gpucloud.asgi import application

    with running_worker(["control", "ingest"], concurrency=4), uvicorn_server(application) as url:
        yield url


def _agent(console: str, token: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = {name: value for name, value in os.environ.items() if name not in SECRETS}
    command = [
        sys.executable,
        "-c",
        "from gpucloud.cli import main; main()",
        "agent",
        "join",
        console,
        token,
        "--credential-file",
        str(tmp_path / "agent" / "credential.json"),
        "--work-dir",
        str(tmp_path / "work"),
        "--probe",
        "simulated",
        "--simulated-gpus",
        "2",
        "--allow-process-runtime",
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _node_state() -> str:
    inventory_tasks.apply_heartbeats()  # the beat's job: heartbeats waiting in the mailbox
    return Node.objects.get(name=NODE).state


@pytest.mark.django_db(transaction=True)
def test_a_host_joins_with_a_token_alone_becomes_ready_and_runs_a_job(
    world: World, console: str, tmp_path: Path
) -> None:
    give_quota(world)
    assign(world.member_a, world.project_a)
    node = register_node(
        actor=actor(world.operator), name=NODE, pool=world.pool, runtime="process", cpu_cores=64, memory_mib=512_000
    )
    token = agents.issue_join_token(actor=actor(world.operator), node=node).secret
    started = time.monotonic()
    agent = _agent(console, token, tmp_path)
    try:
        ready = wait_until(lambda: _node_state() == NodeState.READY, timeout=60, interval=0.2)
        output = b"" if ready else agent.stdout.read1() if agent.stdout else b""  # type: ignore[attr-defined]
        assert ready, f"node stayed {Node.objects.get(name=NODE).state}: {output.decode(errors='replace')}"
        print(f"join -> ready: {time.monotonic() - started:.2f} s")
        credential_file = tmp_path / "agent" / "credential.json"
        assert credential_file.stat().st_mode & 0o077 == 0, "the credential is readable by the owner alone"
        assert Gpu.objects.filter(node__name=NODE, present=True).count() == 2
        assert wait_until(lambda: Node.objects.get(name=NODE).last_heartbeat_at is not None or _node_state() == "")

        job = _submit(world, "for i in range(50):\n    print('line', i, flush=True)\n")
        run_pass_now()
        assert wait_until(
            lambda: Workload.all_tenants.get(pk=job.pk).state in (WorkloadState.SUCCEEDED, WorkloadState.FAILED),
            timeout=60,
        ), Workload.all_tenants.get(pk=job.pk).state
        assert Workload.all_tenants.get(pk=job.pk).state == WorkloadState.SUCCEEDED
        lines = [line for chunk in LogChunk.all_tenants.filter(workload_id=job.pk) for line in chunk.lines]
        assert wait_until(
            lambda: (len([ln for c in LogChunk.all_tenants.filter(workload_id=job.pk) for ln in c.lines]) >= 50),
            timeout=20,
        ), lines
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        try:
            agent.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
        kill_process_sessions(tmp_path / "work")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _lines(job: Workload) -> list[str]:
    chunks = LogChunk.all_tenants.filter(workload_id=job.pk).order_by("first_seq")
    return [line[3] for chunk in chunks for line in chunk.lines]


def _joined_and_ready(world: World, console: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    give_quota(world)
    assign(world.member_a, world.project_a)
    node = register_node(
        actor=actor(world.operator), name=NODE, pool=world.pool, runtime="process", cpu_cores=64, memory_mib=512_000
    )
    agent = _agent(console, agents.issue_join_token(actor=actor(world.operator), node=node).secret, tmp_path)
    assert wait_until(lambda: _node_state() == NodeState.READY, timeout=60, interval=0.2), _output(agent)
    return agent


def _output(agent: subprocess.Popen[bytes]) -> str:
    agent.kill()
    out, _ = agent.communicate(timeout=10)
    return out.decode(errors="replace")[-4000:]


def _settled(job: Workload) -> bool:
    # The beat's periodic work, which no beat runs here: heartbeats, and reconcile (re-watches adopted replicas).
    inventory_tasks.apply_heartbeats()
    return Workload.all_tenants.get(pk=job.pk).state in (WorkloadState.SUCCEEDED, WorkloadState.FAILED)


def _stop(agent: subprocess.Popen[bytes], work_dir: Path) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(agent.pid, signal.SIGTERM)
    try:
        agent.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(agent.pid, signal.SIGKILL)
    kill_process_sessions(work_dir)


PRINTER = "import time\nfor i in range(LINES):\n    print('line', i, flush=True)\n    time.sleep(0.1)\n"


@pytest.mark.django_db(transaction=True)
def test_the_console_going_away_mid_job_loses_no_line_and_no_exit(world: World, tmp_path: Path) -> None:
    from gpucloud.asgi import application

    port = _free_port()
    with running_worker(["control", "ingest"], concurrency=4):
        with uvicorn_server(application, port=port) as console:
            agent = _joined_and_ready(world, console, tmp_path)
            job = _submit(world, PRINTER.replace("LINES", "80"))
            run_pass_now()
            assert wait_until(lambda: len(_lines(job)) >= 5, timeout=30), Workload.all_tenants.get(pk=job.pk).state
        try:
            # The console is down for 4 s while the job prints and ends: the agent keeps it all in its spool.
            time.sleep(4)
            assert len(_lines(job)) < 80
            with uvicorn_server(application, port=port):
                assert wait_until(lambda: _settled(job), timeout=60), Workload.all_tenants.get(pk=job.pk).state
                assert wait_until(lambda: len(_lines(job)) >= 80, timeout=20)
        finally:
            _stop(agent, tmp_path / "work")
    assert Workload.all_tenants.get(pk=job.pk).state == WorkloadState.SUCCEEDED
    assert _lines(job) == [f"line {i}" for i in range(80)], "every line once, in order"


@pytest.mark.django_db(transaction=True)
def test_an_agent_killed_mid_job_and_run_again_adopts_the_job_and_ships_the_rest(
    world: World, console: str, tmp_path: Path
) -> None:
    agent = _joined_and_ready(world, console, tmp_path)
    job = _submit(world, PRINTER.replace("LINES", "60"))
    run_pass_now()
    try:
        assert wait_until(lambda: len(_lines(job)) >= 5, timeout=30), Workload.all_tenants.get(pk=job.pk).state
        os.kill(agent.pid, signal.SIGKILL)  # the agent alone: the job's process is a session of its own
        agent.wait(timeout=10)
        time.sleep(1)
        run = [arg for arg in agent.args if isinstance(arg, str)]  # type: ignore[union-attr]
        again = [*run[:3], "agent", "run", *run[run.index("--credential-file") :]]
        env = {name: value for name, value in os.environ.items() if name not in SECRETS}
        agent = subprocess.Popen(
            again, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )

        def settled_after_reconcile() -> bool:
            reconcile_workloads()  # the beat's job: asks the node what it runs and re-watches it
            return _settled(job)

        assert wait_until(settled_after_reconcile, timeout=90, interval=1.0), Workload.all_tenants.get(pk=job.pk).state
        assert wait_until(lambda: len(_lines(job)) >= 60, timeout=20), len(_lines(job))
    finally:
        _stop(agent, tmp_path / "work")
    assert Workload.all_tenants.get(pk=job.pk).state == WorkloadState.SUCCEEDED
    assert _lines(job) == [f"line {i}" for i in range(60)], "every line once, in order"
