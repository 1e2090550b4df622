"""Reconcile on a shared Docker Engine touches only its own installation's and node's containers.

Two nodes of this console, and a second console (another installation id),
drive one real engine. Each node's reconcile stops its own orphans and
nothing else: the other node's running job, the other console's work (even
one it started for a node of the same name) and a container recording no
owner (started before owners were labelled) all keep running.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from inventory.agent import executor as executor_module
from inventory.agent.config import AgentConfig, activate
from inventory.drivers import policy
from inventory.drivers.base import Handle, PermanentDriverError, WorkloadSpec
from inventory.drivers.docker import DockerRuntime
from inventory.models import Gpu, Node, NodeEvent, agent_queue_for
from inventory.services.installation import installation_id
from jobs import services
from jobs.choices import WorkloadState
from jobs.models import Replica, Workload
from jobs.services import reconcile
from tenants.context import Actor
from tests.conftest import World, docker_cli
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota, run_pass_now
from tests.workers import running_worker, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]
NODE_A, NODE_B = "own-a", "own-b"
OTHER_CONSOLE = "0123456789abcdef"  # another console's installation id on the same engine
LOOP = ["sh", "-c", "while true; do sleep 1; done"]
LEGACY_NETWORK = "gpucloud-tenant-tenant-z"  # tenant-z's bridge as it was named before bridges held the installation


@pytest.fixture
def agents(tmp_path: Path, test_image: str) -> Iterator[DockerRuntime]:
    """The agents of both nodes in this process (one executor serves both queues); removes what the test started."""
    config = AgentConfig(node=NODE_A, work_dir=tmp_path, pull_images=False, probe="simulated")
    activate(config)
    executor_module._executor = executor_module.Executor(config)
    runtime = DockerRuntime(pull_images=False)
    try:
        with running_worker(["control", "ingest", agent_queue_for(NODE_A), agent_queue_for(NODE_B)], concurrency=4):
            yield runtime
    finally:
        executor_module._executor = None
        for managed in runtime.list_managed():
            if managed.tenant in ("tenant-a", "tenant-z"):
                with contextlib.suppress(PermanentDriverError):
                    runtime.remove(managed.handle)
        subprocess.run([docker_cli(), "network", "rm", LEGACY_NETWORK], capture_output=True, check=False, timeout=60)


def _node(world: World, name: str) -> Node:
    node = make_node(
        Actor(user=world.operator), world.pool, name=name, runtime="docker", cpu_cores=8, memory_mib=16_000
    )
    Gpu.objects.create(node=node, index=0, uuid=f"GPU-{name}-0", model="NVIDIA H100 80GB HBM3")
    return node


def _spec(image: str, workload: str, tenant: str, *, installation: str, node: str, name: str = "") -> WorkloadSpec:
    name = name or policy.container_name(installation, workload, 0, 1)
    return WorkloadSpec(name, workload, tenant, 1, image, LOOP, installation=installation, node=node)


def _docker(*args: str) -> str:
    return subprocess.run([docker_cli(), *args], capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def _legacy(image: str, workload: str, tenant: str) -> Handle:
    """Start a container as a console before owner labels and installation names did: old name, old bridge."""
    if not _docker("network", "ls", "-q", "--filter", f"name=^{LEGACY_NETWORK}$"):
        _docker("network", "create", "--label", f"{policy.LABEL_MANAGED}={policy.MANAGED}", LEGACY_NETWORK)
    name = f"gpucloud-w{workload}-r0-a1"
    labels = [f"--label={key}={value}" for key, value in policy.managed_labels(workload, tenant, 1, 0).items()]
    container = _docker("run", "-d", "--init", "--name", name, "--network", LEGACY_NETWORK, *labels, image, *LOOP)
    return {"runtime": "docker", "id": container, "name": name}


def _network(handle: Handle) -> str:
    """Return the one network `handle`'s container is on."""
    return _docker(
        "inspect", "--format", "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}}{{end}}", handle["id"]
    )


def _running(runtime: DockerRuntime, handle: Handle) -> bool:
    return runtime.poll(handle).state == "running"


def test_two_nodes_and_two_consoles_on_one_engine_stop_only_their_own_orphans(
    world: World, agents: DockerRuntime, test_image: str
) -> None:
    runtime = agents
    give_quota(world)
    assign(world.member_a, world.project_a)
    _node(world, NODE_B)
    data = {"name": "b", "image": test_image, "pool": world.pool, "command": LOOP, "gpus_per_replica": 0}
    job = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=data)
    run_pass_now()
    assert wait_until(lambda: Workload.all_tenants.get(pk=job.pk).state == WorkloadState.RUNNING, timeout=30)
    job_handle = Replica.all_tenants.get(workload=job).handle
    _node(world, NODE_A)  # after the pass: the job runs on node B
    mine = installation_id()
    orphan = runtime.start(_spec(test_image, "990001", "tenant-a", installation=mine, node=NODE_A))
    # The other console's work, on a node it also calls own-a, and under the same workload id as our orphan's
    # would be: not ours to stop.
    foreign = runtime.start(_spec(test_image, "990002", "tenant-z", installation=OTHER_CONSOLE, node=NODE_A))
    legacy = _legacy(test_image, "990003", "tenant-z")  # no owner labels, on the old bridge: left alone

    assert reconcile.request_node_inventories() == 2
    assert wait_until(lambda: not [m for m in runtime.list_managed() if m.name == orphan["name"]], timeout=30)
    assert wait_until(lambda: NodeEvent.objects.filter(kind="node.orphan_stopped").exists(), timeout=10)
    stopped = set(NodeEvent.objects.filter(kind="node.orphan_stopped").values_list("node__name", "data__name"))
    assert stopped == {(NODE_A, orphan["name"])}
    assert _running(runtime, job_handle), "node A's reconcile left node B's job running"
    assert Workload.all_tenants.get(pk=job.pk).state == WorkloadState.RUNNING
    assert _running(runtime, foreign), "the other console's container keeps running"
    assert _running(runtime, legacy), "a container recording no owner is left alone"
    # This console's tenant-z starts beside it on a bridge of its own: the old bridge is not in its way.
    beside = runtime.start(_spec(test_image, "990004", "tenant-z", installation=mine, node=NODE_A))
    assert _running(runtime, beside) and _network(beside) == policy.tenant_network_name(mine, "tenant-z")
    assert _network(legacy) == LEGACY_NETWORK


def test_a_node_lists_only_its_own_installations_work_and_never_adopts_anothers(
    tmp_path: Path, agents: DockerRuntime, test_image: str
) -> None:
    runtime = agents
    ours = runtime.start(_spec(test_image, "990011", "tenant-a", installation=OTHER_CONSOLE[::-1], node=NODE_A))
    theirs = _spec(test_image, "990012", "tenant-z", installation=OTHER_CONSOLE, node=NODE_A)
    runtime.start(theirs)
    agent = executor_module.Executor(AgentConfig(node=NODE_A, work_dir=tmp_path, pull_images=False))
    view = agent.inventory_report(node=NODE_A, runtime="docker", confirmed=[], installation=OTHER_CONSOLE[::-1])
    names = {item["name"] for item in view["managed"]}
    assert ours["name"] in names and theirs.name not in names
    as_other_node = agent.inventory_report(node=NODE_B, runtime="docker", confirmed=[], installation=OTHER_CONSOLE)
    assert theirs.name not in {item["name"] for item in as_other_node["managed"]}
    # A start of this console's replica under a name the other console already used is refused, not adopted.
    same_name = _spec(test_image, "990012", "tenant-z", installation=OTHER_CONSOLE[::-1], node=NODE_A, name=theirs.name)
    with pytest.raises(PermanentDriverError) as refused:
        runtime.start(same_name)
    assert refused.value.code == "name_conflict"
