"""Execution on the real Docker Engine: a job's logs and exit code, SIGTERM and the grace period, orphans.

The node's agent runs in this process with the Docker runtime; images come
from the locally built test image (nothing is pulled).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inventory.agent import executor as executor_module
from inventory.agent.config import AgentConfig, activate
from inventory.drivers.base import WorkloadSpec
from inventory.drivers.docker import DockerRuntime
from inventory.models import Gpu, Node, NodeEvent, agent_queue_for
from inventory.services.installation import installation_id
from jobs import selectors, services
from jobs.choices import ReasonCode, WorkloadState
from jobs.models import Allocation, Replica, Workload, WorkloadEvent
from jobs.services import reconcile
from jobs.services.execution import container_name
from tenants.context import Actor
from tenants.scoping import tenant_scope
from tests.conftest import World
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota, run_pass_now
from tests.jobs.test_proxy import browser, console  # noqa: F401 -- the console under uvicorn, as a fixture
from tests.workers import running_worker, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]
NODE = "exec-docker"


@pytest.fixture
def docker_agent(tmp_path: Path, test_image: str) -> Iterator[AgentConfig]:
    """The agent of node `exec-docker` in this process, driving the local Docker Engine."""
    config = AgentConfig(node=NODE, work_dir=tmp_path, pull_images=False, probe="simulated")
    activate(config)
    executor_module._executor = executor_module.Executor(config)
    with running_worker(["control", "ingest", agent_queue_for(NODE)], concurrency=4):
        yield config
    executor_module._executor = None
    runtime = DockerRuntime(pull_images=False)
    for managed in runtime.list_managed():
        if managed.tenant == "tenant-a":
            runtime.remove(managed.handle)


def _world(world: World) -> Node:
    give_quota(world)
    assign(world.member_a, world.project_a)
    node = make_node(
        Actor(user=world.operator), world.pool, name=NODE, runtime="docker", cpu_cores=8, memory_mib=16_000
    )
    Gpu.objects.create(node=node, index=0, uuid=f"GPU-{NODE}-0", model="NVIDIA H100 80GB HBM3")
    return node


def _submit(world: World, image: str, script: str, **fields: Any) -> Workload:
    data = {
        "name": "job",
        "image": image,
        "pool": world.pool,
        "command": ["sh", "-c", script],
        "gpus_per_replica": 0,
        "cpu_milli": 500,
        "memory_mib": 64,
        **fields,
    }
    return services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=data)


def _reached(workload: Workload, *states: str, timeout: float = 30.0) -> Workload:
    def current() -> str:
        return Workload.all_tenants.get(pk=workload.pk).state

    assert wait_until(lambda: current() in states, timeout=timeout), f"stayed {current()}: " + "; ".join(
        f"{e.to_state} {e.message}" for e in WorkloadEvent.all_tenants.filter(workload_id=workload.pk)
    )
    return Workload.all_tenants.get(pk=workload.pk)


def _log_text(world: World, workload: Workload) -> list[str]:
    with tenant_scope(world.tenant_a):
        return [line["text"] for line in selectors.iter_log_lines(workload)]


def test_a_container_job_runs_its_logs_arrive_and_exit_codes_map_to_states(
    world: World, docker_agent: AgentConfig, test_image: str
) -> None:
    _world(world)
    failing = _submit(world, test_image, "echo to stdout; echo to stderr >&2; exit 3")
    passing = _submit(world, test_image, "for i in 1 2 3; do echo line $i; done", name="ok")
    run_pass_now()
    failing = _reached(failing, WorkloadState.FAILED)
    passing = _reached(passing, WorkloadState.SUCCEEDED)
    assert (failing.exit_code, failing.reason_code) == (3, ReasonCode.EXIT_NONZERO)
    assert passing.exit_code == 0
    assert wait_until(lambda: len(_log_text(world, passing)) == 3)
    assert _log_text(world, passing) == ["line 1", "line 2", "line 3"]
    assert wait_until(lambda: sorted(_log_text(world, failing)) == ["to stderr", "to stdout"])
    assert not Allocation.all_tenants.filter(workload__in=[failing, passing], released_at__isnull=True).exists()


def test_a_container_trapping_sigterm_gets_its_grace_period_and_one_ignoring_it_is_killed(
    world: World, docker_agent: AgentConfig, test_image: str
) -> None:
    _world(world)
    world.pool.stop_grace_seconds = 3
    world.pool.save()
    polite = _submit(
        world, test_image, "trap 'echo cleaning up; sleep 0.3; exit 0' TERM; echo up; while true; do sleep 0.1; done"
    )
    stubborn = _submit(world, test_image, "trap '' TERM; echo up; while true; do sleep 0.1; done", name="stubborn")
    run_pass_now()
    for workload in (polite, stubborn):
        _reached(workload, WorkloadState.RUNNING)
    started = time.monotonic()
    for workload in (polite, stubborn):
        services.cancel_workload(actor=Actor(user=world.member_a), workload=workload)

    def exited(workload: Workload) -> Replica | None:
        return Replica.all_tenants.filter(workload=workload, state="exited").first()

    assert wait_until(lambda: exited(polite) is not None and exited(stubborn) is not None, timeout=30)
    assert exited(polite).exit_code == 0, "it finished its cleanup within the grace period"  # type: ignore[union-attr]
    assert exited(stubborn).exit_code == 137, "killed after the grace period"  # type: ignore[union-attr]
    assert time.monotonic() - started >= 3, "the stubborn one had its 3 s before SIGKILL"
    assert wait_until(lambda: "cleaning up" in _log_text(world, polite), timeout=30)


def test_reconcile_stops_an_orphan_container_and_releases_a_dangling_allocation(
    world: World, docker_agent: AgentConfig, test_image: str
) -> None:
    _world(world)
    runtime = DockerRuntime(pull_images=False)
    orphan = WorkloadSpec(
        name=container_name(999999, 0, 1),
        workload_id="999999",
        tenant="tenant-a",
        attempt=1,
        image=test_image,
        command=["sh", "-c", "while true; do sleep 1; done"],
        installation=installation_id(),
        node=NODE,
    )
    runtime.start(orphan)
    job = _submit(world, test_image, "echo done")
    run_pass_now()
    job = _reached(job, WorkloadState.SUCCEEDED)
    # A crash left the job's allocation behind: reconcile releases it.
    Allocation.all_tenants.filter(workload=job).update(released_at=None)
    reconcile.reconcile_ledger()
    assert not Allocation.all_tenants.filter(workload=job, released_at__isnull=True).exists()
    reconcile.request_node_inventories()

    def gone() -> bool:
        return not [m for m in runtime.list_managed() if m.name == orphan.name]

    assert wait_until(gone, timeout=30), "the orphan container was stopped and removed"
    assert NodeEvent.objects.filter(node__name=NODE, kind="node.orphan_stopped").exists()


HTTPD = (
    "root=/tmp/www/notebooks/$GPUCLOUD_WORKLOAD_ID; mkdir -p $root/api && echo ok > $root/api/status"
    ' && echo "served from the container" > $root/index.html && exec httpd -f -p $JUPYTER_PORT -h /tmp/www'
)


def test_a_container_serving_http_is_reached_through_the_console_proxy_by_its_owner_only(
    world: World,
    docker_agent: AgentConfig,
    test_image: str,
    console: str,  # noqa: F811 -- the fixture imported above
) -> None:
    _world(world)
    # A notebook image of its own: busybox httpd stands in for Jupyter (same base URL, port and status URL).
    served = _submit(world, test_image, HTTPD, kind="notebook", name="httpd")
    run_pass_now()
    served = _reached(served, WorkloadState.RUNNING)
    path = f"/notebooks/{served.pk}/index.html"
    with browser(console, world.member_a, served.pk) as owner:
        answer = owner.get(path)
        assert answer.status_code == 200 and answer.text == "served from the container\n"
    with browser(console, world.admin_b, served.pk) as outsider:
        assert outsider.get(path).status_code == 404
    with browser(console, None, served.pk) as anonymous:
        assert anonymous.get(path).status_code == 404


def test_a_container_keeps_its_files_and_checkpoints_across_attempts_and_gets_its_own_stop_signal(
    world: World, docker_agent: AgentConfig, test_image: str
) -> None:
    """Attempt 1 writes its home and checkpoint directory and is stopped with SIGUSR1 (its checkpoint cue);
    attempt 2 of the same workload, in a fresh container, finds both, runs as the same uid, and cannot
    write the dataset it mounts read-only."""
    from inventory.choices import VolumeKind
    from inventory.services.volumes import create_volume

    _world(world)
    world.pool.stop_grace_seconds = 5
    world.pool.save()
    create_volume(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, kind=VolumeKind.DATASET, name="corpus",
        project=world.project_a,
    )  # fmt: skip
    script = (
        'if [ -f "$HOME/notes" ]; then echo "found $(cat $HOME/notes) $(cat $GPUCLOUD_CHECKPOINT_DIR/step)"; '
        "echo uid $(id -u) pwd $(pwd); "
        "touch /datasets/corpus/x 2>/dev/null && echo wrote || echo read-only; exit 0; fi; "
        'echo hello > "$HOME/notes"; mkdir -p "$GPUCLOUD_CHECKPOINT_DIR"; '
        "trap 'echo 41 > $GPUCLOUD_CHECKPOINT_DIR/step; echo checkpointed; exit 0' USR1; "
        "echo up; while true; do sleep 0.1; done"
    )
    job = _submit(world, test_image, script, stop_signal="SIGUSR1")
    run_pass_now()
    job = _reached(job, WorkloadState.RUNNING)
    assert wait_until(lambda: "up" in _log_text(world, job), timeout=30)
    services.cancel_workload(actor=Actor(user=world.member_a), workload=job)
    assert wait_until(lambda: "checkpointed" in _log_text(world, job), timeout=30), "SIGUSR1 was its stop signal"
    assert wait_until(
        lambda: not Allocation.all_tenants.filter(workload=job, released_at__isnull=True).exists(), timeout=30
    )
    first_uid = Replica.all_tenants.get(workload=job, attempt=1).name
    services.restart_workload(actor=Actor(user=world.member_a), workload=job)
    run_pass_now()
    job = _reached(job, WorkloadState.SUCCEEDED, timeout=60)
    home = "/home/member_a"
    assert wait_until(lambda: any(line.startswith("found") for line in _log_text(world, job)), timeout=30)
    lines = _log_text(world, job)
    assert "found hello 41" in lines, lines
    from inventory.services.volume_access import uid_of

    assert f"uid {uid_of(world.member_a)} pwd {home}" in lines
    assert "read-only" in lines
    assert first_uid != Replica.all_tenants.get(workload=job, attempt=2).name, "a fresh container"
