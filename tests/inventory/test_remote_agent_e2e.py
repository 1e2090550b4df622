"""A GPU host joins for real: a separate agent process with no SECRET_KEY, database or Redis of the console.

The console runs under uvicorn with its controller worker; the agent is
`gpucloud agent join URL TOKEN` in a child process whose environment holds
none of the console's secrets. It exchanges the token, provisions the node
to ready through the gateway, runs a job placed on it (process runtime) and
ships its output and exit; the job ends succeeded with every line stored.
"""

from __future__ import annotations

import os
import signal
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
        actor=actor(world.operator), name=NODE, pool=world.pool, runtime="process", cpu_cores=64, memory_mb=512_000
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
