"""Execution end to end through a real worker, a real agent executor and the process runtime.

Each test submits through the service, runs a real scheduling pass, and
lets the launch, the agent's reports and the stop path run through the
Celery worker (in-process transport, or Redis when REDIS_URL is set).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inventory.agent import executor as executor_module
from inventory.agent.config import AgentConfig, activate
from inventory.models import Gpu, Node, agent_queue_for
from inventory.services.mounts import checkpoint_host_dirs
from jobs import selectors, services
from jobs.choices import ReasonCode, WorkloadState
from jobs.models import Allocation, Replica, ReplicaState, Workload, WorkloadEvent
from jobs.services import reconcile
from jobs.services.execution import container_name
from tenants.context import Actor
from tenants.models import Project
from tenants.scoping import tenant_scope
from tests.conftest import World
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota, run_pass_now
from tests.process_user import workload_python
from tests.workers import running_worker, wait_until

NODE = "exec-local"


@pytest.fixture
def agent(workload_tmp: Path) -> Iterator[AgentConfig]:
    """The agent of node `exec-local` in this process (process runtime), with the controller's worker."""
    config = AgentConfig(
        node=NODE, work_dir=workload_tmp, process_enabled=True, probe="simulated", checkpoint_seconds=0.2
    )
    activate(config)
    executor_module._executor = executor_module.Executor(config)
    with running_worker(["control", "ingest", agent_queue_for(NODE)], concurrency=4):
        yield config
    executor_module._executor = None


def _world(world: World, gpus: int = 4, **quota: Any) -> Node:
    give_quota(world, **quota)
    assign(world.member_a, world.project_a)
    node = make_node(
        Actor(user=world.operator), world.pool, name=NODE, runtime="process", cpu_cores=64, memory_mib=512_000
    )
    for index in range(gpus):
        Gpu.objects.create(node=node, index=index, uuid=f"GPU-{NODE}-{index}", model="NVIDIA H100 80GB HBM3")
    return node


def _submit(world: World, script: str, **fields: Any) -> Workload:
    data = {
        "name": "job",
        "image": "registry.example.com/python:3",
        "pool": world.pool,
        "command": [*workload_python(), "-c", textwrap.dedent(script)],
        **fields,
    }
    return services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=data)


def _state(workload: Workload) -> str:
    return Workload.all_tenants.get(pk=workload.pk).state


def _reached(workload: Workload, *states: str, timeout: float = 20.0) -> Workload:
    assert wait_until(lambda: _state(workload) in states, timeout=timeout), (
        f"workload stayed {_state(workload)}; events: "
        + "; ".join(f"{e.to_state} {e.message}" for e in WorkloadEvent.all_tenants.filter(workload_id=workload.pk))
    )
    return Workload.all_tenants.get(pk=workload.pk)


def _active_allocations(workload: Workload) -> int:
    return Allocation.all_tenants.filter(workload_id=workload.pk, released_at__isnull=True).count()


@pytest.mark.django_db(transaction=True)
def test_a_job_runs_and_its_exit_code_decides_its_state(world: World, agent: AgentConfig) -> None:
    _world(world)
    ok = _submit(world, "import time; print('hello', flush=True); time.sleep(0.5)")
    bad = _submit(world, "import sys; print('oops', file=sys.stderr); sys.exit(3)", name="bad")
    run_pass_now()
    ok = _reached(ok, WorkloadState.SUCCEEDED)
    bad = _reached(bad, WorkloadState.FAILED)
    assert (ok.exit_code, ok.reason_code) == (0, ReasonCode.EXITED)
    assert (bad.exit_code, bad.reason_code) == (3, ReasonCode.EXIT_NONZERO)
    assert "exited with code 3" in bad.reason_message
    path = list(WorkloadEvent.all_tenants.filter(workload_id=ok.pk).values_list("to_state", flat=True))
    assert path == ["pending", "scheduled", "starting", "running", "succeeded"]
    assert ok.started_at is not None and ok.finished_at is not None
    for workload in (ok, bad):
        assert _active_allocations(workload) == 0, "the GPUs are released once the replica exited"
        replica = Replica.all_tenants.get(workload=workload)
        assert replica.state == ReplicaState.EXITED and replica.name == container_name(workload.pk, 0, 1)


@pytest.mark.django_db(transaction=True)
def test_the_node_reports_a_checkpoint_the_job_writes_and_the_ledger_records_when(
    world: World, agent: AgentConfig
) -> None:
    _world(world)
    job = _submit(
        world,
        """
        import os, pathlib, time
        directory = pathlib.Path(os.environ["GPUCLOUD_CHECKPOINT_DIR"])
        print("ready:", directory.is_dir(), flush=True)  # made by the agent before the start
        time.sleep(0.5)
        (directory / "step-100.pt").write_bytes(b"weights")
        print("saved", flush=True)
        time.sleep(60)
        """,
    )
    run_pass_now()
    _reached(job, WorkloadState.RUNNING)
    assert wait_until(lambda: Workload.all_tenants.get(pk=job.pk).checkpointed_at is not None, timeout=15)
    recorded = Workload.all_tenants.get(pk=job.pk)
    directory = Path(checkpoint_host_dirs([(job.pk, world.project_a.pk)], console=False)[job.pk])
    assert recorded.checkpointed_at is not None
    assert abs(recorded.checkpointed_at.timestamp() - (directory / "step-100.pt").stat().st_mtime) < 0.01
    assert WorkloadEvent.all_tenants.filter(workload=job, kind="workload.checkpoint").count() == 1
    with tenant_scope(world.tenant_a):
        assert "ready: True" in [line["text"] for line in selectors.iter_log_lines(recorded)]
    services.cancel_workload(actor=Actor(user=world.member_a), workload=recorded)
    _reached(job, WorkloadState.CANCELLED)


@pytest.mark.django_db(transaction=True)
def test_cancel_stops_a_running_job_with_sigterm_and_frees_its_gpus_after_it_exits(
    world: World, agent: AgentConfig
) -> None:
    _world(world)
    job = _submit(
        world,
        """
        import signal, sys, time
        def term(*_):
            time.sleep(0.3)  # cleaning up inside the grace period
            sys.exit(0)
        signal.signal(signal.SIGTERM, term)
        print('ready', flush=True)
        while True:
            time.sleep(0.05)
        """,
    )
    run_pass_now()
    job = _reached(job, WorkloadState.RUNNING)
    assert _active_allocations(job) == 1
    # Its handler is in place once it says so (its interpreter may start slower than the report of its start).
    assert wait_until(lambda: "ready" in [line["text"] for line in selectors.iter_log_lines(job)])
    cancelled = services.cancel_workload(actor=Actor(user=world.member_a), workload=job)
    assert cancelled.state == WorkloadState.CANCELLED and cancelled.reason_code == ReasonCode.STOPPED_BY_USER
    assert wait_until(lambda: _active_allocations(job) == 0), "GPUs are freed once the node confirms the stop"
    replica = Replica.all_tenants.get(workload=job)
    assert (replica.state, replica.exit_code) == (ReplicaState.EXITED, 0), "it exited by its own SIGTERM handler"


@pytest.mark.django_db(transaction=True)
def test_a_process_that_ignores_sigterm_is_killed_after_the_pool_grace_period(world: World, agent: AgentConfig) -> None:
    _world(world)
    world.pool.stop_grace_seconds = 1
    world.pool.save()
    job = _submit(
        world,
        """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('ready', flush=True)
        while True:
            time.sleep(0.05)
        """,
    )
    run_pass_now()
    job = _reached(job, WorkloadState.RUNNING)
    services.cancel_workload(actor=Actor(user=world.member_a), workload=job)
    assert wait_until(lambda: _active_allocations(job) == 0, timeout=15)
    replica = Replica.all_tenants.get(workload=job)
    assert replica.exit_code is not None and replica.exit_code != 0, "killed, not exited by itself"


GANG_SCRIPT = """
import os, socket, sys, time
rank, world_size = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
assert world_size == 2 and os.environ['LOCAL_RANK'] == os.environ['RANK'], dict(os.environ)
address = (os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']))
if rank == 0:
    server = socket.create_server(address)
    server.settimeout(20)
    peer, _ = server.accept()
    peer.sendall(b'hello from rank 0')
    peer.close()
else:
    for _ in range(200):
        try:
            with socket.create_connection(address, timeout=1) as conn:
                sys.exit(0 if conn.recv(64) == b'hello from rank 0' else 5)
        except OSError:
            time.sleep(0.1)
    sys.exit(6)
"""


@pytest.mark.django_db(transaction=True)
def test_gang_replicas_get_torchrun_variables_and_reach_each_other(world: World, agent: AgentConfig) -> None:
    _world(world)
    gang = _submit(world, GANG_SCRIPT, replicas=2, gpus_per_replica=2)
    run_pass_now()
    gang = _reached(gang, WorkloadState.SUCCEEDED, WorkloadState.FAILED)
    assert gang.state == WorkloadState.SUCCEEDED, gang.reason_message
    assert sorted(Replica.all_tenants.filter(workload=gang).values_list("index", "exit_code")) == [(0, 0), (1, 0)]


@pytest.mark.django_db(transaction=True)
def test_one_failing_replica_stops_the_whole_gang(world: World, agent: AgentConfig) -> None:
    _world(world)
    script = """
    import os, sys, time
    if os.environ['RANK'] == '1':
        sys.exit(7)
    while True:
        time.sleep(0.05)
    """
    gang = _submit(world, script, replicas=2)
    run_pass_now()
    gang = _reached(gang, WorkloadState.FAILED)
    assert gang.exit_code == 7 and "Replica 1 exited with code 7" in gang.reason_message
    assert wait_until(lambda: _active_allocations(gang) == 0), "rank 0 is stopped and its GPU freed too"
    assert not Replica.all_tenants.filter(workload=gang, state__in=["launching", "running"]).exists()


@pytest.mark.django_db(transaction=True)
def test_restart_runs_an_ended_job_again_as_a_new_attempt(world: World, agent: AgentConfig) -> None:
    _world(world)
    job = _submit(world, "import os, sys; sys.exit(0 if os.environ['GPUCLOUD_ATTEMPT'] == '2' else 1)")
    run_pass_now()
    job = _reached(job, WorkloadState.FAILED)
    restarted = services.restart_workload(actor=Actor(user=world.member_a), workload=job)
    assert (restarted.state, restarted.attempt, restarted.reason_code) == ("pending", 2, ReasonCode.RESTARTED)
    run_pass_now()
    job = _reached(job, WorkloadState.SUCCEEDED)
    assert Replica.all_tenants.filter(workload=job).count() == 2, "one replica row per attempt"


TRAP_SCRIPT = """
import signal, sys, time
def term(*_):
    print('got SIGTERM', flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
while True:
    time.sleep(0.05)
"""


@pytest.mark.django_db(transaction=True)
def test_reclaim_stops_the_borrower_politely_requeues_it_and_then_places_the_guaranteed_work(
    world: World, agent: AgentConfig, settings: Any
) -> None:
    settings.SCHEDULER_MIN_RUNTIME_SECONDS = 0
    _world(world, gpus=4, guaranteed=0, limit=4)
    gamma = Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    give_quota(world, gamma, guaranteed=4, limit=4)
    assign(world.member_a, gamma)
    borrower = _submit(world, TRAP_SCRIPT, name="borrower", gpus_per_replica=4)
    run_pass_now()
    borrower = _reached(borrower, WorkloadState.RUNNING)
    owed = services.submit_workload(
        actor=Actor(user=world.member_a),
        project=gamma,
        data={
            "name": "owed",
            "image": "registry.example.com/python:3",
            "pool": world.pool,
            "gpus_per_replica": 4,
            "command": [*workload_python(), "-c", "print('mine now')"],
        },
    )
    run_pass_now()
    preempted = Workload.all_tenants.get(pk=borrower.pk)
    assert preempted.state in (WorkloadState.PREEMPTED, WorkloadState.PENDING)
    assert preempted.reason_code == ReasonCode.RECLAIM_GUARANTEE
    # The claimant is not given GPUs the borrower still holds during its grace period.
    assert Workload.all_tenants.get(pk=owed.pk).state == WorkloadState.PENDING
    requeued = _reached(borrower, WorkloadState.PENDING)
    assert requeued.attempt == 2 and requeued.submitted_at == borrower.submitted_at, "keeps its place in order"
    assert Replica.all_tenants.get(workload=borrower, attempt=1).exit_code == 0, "it exited by its SIGTERM handler"
    run_pass_now()
    assert _reached(owed, WorkloadState.SUCCEEDED).exit_code == 0
    kinds = list(WorkloadEvent.all_tenants.filter(workload_id=borrower.pk).values_list("to_state", flat=True))
    assert kinds[-2:] == ["preempted", "pending"]


@pytest.mark.django_db(transaction=True)
def test_a_notebook_runs_only_once_jupyter_answers_with_its_session_secret(
    world: World, agent: AgentConfig, settings: Any
) -> None:
    settings.NOTEBOOK_COMMAND = [*workload_python(), "-m", "jupyter_server"]
    _world(world)
    notebook = services.submit_workload(
        actor=Actor(user=world.member_a),
        project=world.project_a,
        data={"name": "nb", "kind": "notebook", "image": "registry.example.com/jupyter:4", "pool": world.pool},
    )
    run_pass_now()
    notebook = _reached(notebook, WorkloadState.RUNNING, timeout=60)
    replica = Replica.all_tenants.get(workload=notebook)
    assert replica.ready_at is not None and replica.endpoint.startswith("http://127.0.0.1:")
    secret = notebook.session_secret
    assert len(secret) >= 32
    status_url = f"{replica.endpoint}/notebooks/{notebook.pk}/api/status"
    assert httpx.get(status_url, headers={"Authorization": f"token {secret}"}).status_code == 200
    assert httpx.get(status_url).status_code == 403, "Jupyter itself refuses requests without the session secret"
    services.cancel_workload(actor=Actor(user=world.member_a), workload=notebook)
    assert wait_until(lambda: _active_allocations(notebook) == 0, timeout=30)
    with pytest.raises(httpx.TransportError):
        httpx.get(status_url, headers={"Authorization": f"token {secret}"}, timeout=2)


@pytest.mark.django_db(transaction=True)
def test_output_survives_an_agent_that_dies_mid_run_without_a_gap_or_a_duplicate(
    world: World, agent: AgentConfig
) -> None:
    _world(world)
    job = _submit(world, "import time\nfor i in range(60):\n    print(f'line {i}', flush=True)\n    time.sleep(0.05)")
    run_pass_now()
    job = _reached(job, WorkloadState.RUNNING)
    assert wait_until(lambda: Workload.all_tenants.get(pk=job.pk).log_seq >= 10)
    # The agent dies: whatever its threads still send is lost. The process keeps running on the node.
    dead = executor_module._executor
    assert dead is not None
    dead.report = lambda *args, **kwargs: None  # type: ignore[method-assign]
    dead.outbox._send = lambda *args, **kwargs: None  # its log batches too
    executor_module._executor = executor_module.Executor(agent)
    # Reconcile asks the node what it runs; the new agent resumes the output at the ledger's cursor.
    reconcile.request_node_inventories()
    job = _reached(job, WorkloadState.SUCCEEDED)
    with tenant_scope(world.tenant_a):
        texts = [line["text"] for line in selectors.iter_log_lines(job)]
    assert texts == [f"line {i}" for i in range(60)]


@pytest.mark.django_db(transaction=True)
def test_reports_that_arrive_late_are_applied_and_a_stale_list_fails_nothing(world: World, workload_tmp: Path) -> None:
    """A starved controller: the agent runs the job while nobody applies its reports, and a node list taken
    before the start is applied minutes later. The job still ends Succeeded with its whole log."""
    from datetime import timedelta

    from django.utils import timezone

    from gpucloud import embedded
    from gpucloud.celery import app
    from jobs.services.execution import launch_workloads

    config = AgentConfig(
        node=NODE, work_dir=workload_tmp, process_enabled=True, probe="simulated", checkpoint_seconds=0.2
    )
    activate(config)
    executor_module._executor = executor_module.Executor(config)
    _world(world)
    job = _submit(world, "import time\nfor i in range(30):\n    print(f'line {i}', flush=True)\n    time.sleep(0.02)")
    try:
        with running_worker([agent_queue_for(NODE)], concurrency=4):  # the agent alone; the controller is stalled
            run_pass_now()
            assert launch_workloads(workload_ids=[job.pk]) == 1
            work = workload_tmp / container_name(job.pk, 0, 1)
            assert wait_until(lambda: any(work.glob("exit*")) or (work / "state.json").exists(), timeout=20)
            # Started (no longer starting), watched to its end and forgotten: its exit report was sent.
            agent = executor_module.executor()
            assert wait_until(lambda: work.name not in agent._starting and work.name not in agent._watchers, timeout=20)
        # Minutes later, a list the node sent before the replica existed is applied: it proves nothing.
        Replica.all_tenants.filter(workload=job).update(created_at=timezone.now() - timedelta(minutes=10))
        counts = reconcile.reconcile_node(node=NODE, managed=[], starting=[], gone=[])
        assert counts["vanished"] == 0
        assert _state(job) == WorkloadState.STARTING
        # The controller catches up: the late start, output and exit are applied in whatever order they come.
        late = embedded.start_worker(app, queues=["control", "ingest"], concurrency=4, hostname="late@test")
        try:
            job = _reached(job, WorkloadState.SUCCEEDED)
            assert wait_until(lambda: Workload.all_tenants.get(pk=job.pk).log_seq >= 30)
        finally:
            late.stop(in_sighandler=False)
    finally:
        executor_module._executor = None
    with tenant_scope(world.tenant_a):
        texts = [line["text"] for line in selectors.iter_log_lines(job)]
    assert texts == [f"line {i}" for i in range(30)]
    assert job.exit_code == 0 and _active_allocations(job) == 0
