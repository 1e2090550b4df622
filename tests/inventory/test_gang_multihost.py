"""A gang across two hosts: real PyTorch all-reduce over gloo between two Docker engines in one swarm, isolated.

The hosts are network namespaces of this machine, each with a Docker
engine of its own, cabled to one switch and joined in a swarm
(.ci/multihost-engines); the machine's own engine is left alone. The gang
goes the console's whole way: submitted, placed by the scheduler on two
nodes (one CPU each, so the two replicas cannot share one), launched with
the specs `replica_spec` builds, started by the node agent's executor, each
node's runtime talking to its own engine. Every rank checks the all-reduce's
result itself; the job succeeds only if both do.

While the gang holds its rendezvous port, containers that are not in it try
to connect: another tenant's on each host and the same tenant's non-gang
one, by replica 0's name, its overlay address, its address on the host's
egress bridge and the host's own address. Each first connects to a port of
its own, so a refusal is not a broken probe.

The failure paths of the gang network run on real engines too: the
machine's own engine (in no swarm) refuses a gang's replicas with
`no_swarm`; on the swarm's worker alone a gang fails with
`gang_network_missing`; idle gang networks are pruned, young or used ones
not; a manager's removal while a container on another host still uses the
network is refused by the swarm, and tolerated.

The tests on the two engines need root, iproute2, dockerd and debootstrap
and are marked `multihost`: opt-in, required (failing rather than
skipping) in CI's Postgres and Redis pass only (tests/conftest.py). The
engines are built once for the module.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from inventory.agent import executor as executor_module
from inventory.agent.config import AgentConfig, activate
from inventory.choices import NodeState
from inventory.drivers import policy
from inventory.drivers.base import PermanentDriverError, WorkloadSpec
from inventory.drivers.docker import DockerRuntime
from inventory.drivers.docker._engine import Budget
from inventory.drivers.docker._gangs import IDLE_GRACE_SECONDS, GangNetworks
from inventory.models import Gpu, Node, agent_queue_for
from inventory.services.installation import installation_id
from inventory.services.provisioning import complete_provisioning
from jobs import selectors, services
from jobs.choices import ReasonCode, WorkloadState
from jobs.models import Replica, Workload, WorkloadEvent
from jobs.scheduler.core.explain import SPAN_NOTE
from jobs.services.execution import container_name
from tenants.context import Actor
from tenants.scoping import tenant_scope
from tests.conftest import ROOT, World, docker_cli
from tests.inventory.drivers.conftest import TEST_INSTALLATION
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota, run_pass_now
from tests.workers import running_worker, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

TORCH_IMAGE = "gpucloud-test/torch:latest"
NODES = ("gang-host-1", "gang-host-2")
LOCAL_ENGINE = "unix:///var/run/docker.sock"  # the machine's own engine, in no swarm
HOST_ADDRESSES = ("10.231.0.11", "10.231.0.12")
HOLD_SECONDS = 30  # how long the ranks keep the rendezvous port open after the all-reduce, for the probes

RANK_SCRIPT = f"""
import datetime, os, sys, time
import torch, torch.distributed as dist
began = time.monotonic()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=90))
rendezvous = time.monotonic() - began
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
dist.all_reduce(value)
expected = [world * (world + 1) / 2, 10.0 * world * (world + 1) / 2]
ok = value.tolist() == expected
print(f"rank {{rank}}/{{world}} master {{os.environ['MASTER_ADDR']}}:{{os.environ['MASTER_PORT']}}"
      f" rendezvous {{rendezvous:.3f}} s all_reduce {{value.tolist()}} expected {{expected}} ok {{ok}}", flush=True)
time.sleep({HOLD_SECONDS})
dist.barrier()
dist.destroy_process_group()
sys.exit(0 if ok else 1)
"""


def _docker(url: str, *args: str, timeout: float = 60) -> str:
    done = subprocess.run([docker_cli(), "-H", url, *args], capture_output=True, text=True, timeout=timeout, check=True)
    return done.stdout


@pytest.fixture(scope="module")
def engines(test_image: str) -> Iterator[list[str]]:
    """Two engines in one swarm (host 1 the manager), each holding the torch and busybox test images.

    Only tests marked `multihost` may ask for it: the mark is what gates on root and the tools (tests/conftest.py).
    """
    subprocess.run([str(ROOT / ".ci" / "build-torch-image"), TORCH_IMAGE], check=True, timeout=900)
    state = tempfile.mkdtemp(prefix="gpucloud-multihost-")
    script = str(ROOT / ".ci" / "multihost-engines")
    try:
        up = subprocess.run([script, "up", state, "2"], capture_output=True, text=True, timeout=180, check=False)
        assert up.returncode == 0, f"multihost-engines up failed: {up.stderr}"
        urls = up.stdout.split()
        for url in urls:
            for image in (TORCH_IMAGE, test_image):
                with subprocess.Popen([docker_cli(), "save", image], stdout=subprocess.PIPE) as save:
                    subprocess.run([docker_cli(), "-H", url, "load"], stdin=save.stdout, check=True, timeout=300)
        yield urls
    finally:
        subprocess.run([script, "down", state], timeout=120, check=False)


@contextmanager
def _agents(work_dir: Path, urls: list[str], **options: Any) -> Iterator[dict[str, DockerRuntime]]:
    """The agents of both nodes in this process; node i's runtime drives the engine at urls[i]."""
    config = AgentConfig(node=NODES[0], work_dir=work_dir, pull_images=False, probe="simulated")
    activate(config)
    executor = executor_module.Executor(config)
    runtimes = {node: DockerRuntime(url, pull_images=False, **options) for node, url in zip(NODES, urls, strict=True)}
    for node, runtime in runtimes.items():
        executor._runtimes[("docker", node)] = runtime  # each node's agent has its own engine: one per host
    executor_module._executor = executor
    try:
        with running_worker(["control", "ingest", *(agent_queue_for(node) for node in NODES)], concurrency=4):
            yield runtimes
    finally:
        executor_module._executor = None


@pytest.fixture
def gang_agent(tmp_path: Path, engines: list[str]) -> Iterator[dict[str, DockerRuntime]]:
    """The agents of both nodes, each on its own engine of the swarm."""
    with _agents(tmp_path, engines) as runtimes:
        yield runtimes


def _world(world: World, state: NodeState = NodeState.READY) -> None:
    give_quota(world)
    assign(world.member_a, world.project_a)
    for node_name, address in zip(NODES, HOST_ADDRESSES, strict=True):
        node = make_node(
            Actor(user=world.operator),
            world.pool,
            name=node_name,
            state=state,
            runtime="docker",
            address=address,
            cpu_cores=1,
            memory_mib=4_000,
        )
        Gpu.objects.create(node=node, index=0, uuid=f"GPU-{node_name}-0", model="NVIDIA H100 80GB HBM3")


def _probed(world: World, engine_of: dict[str, str]) -> None:
    """Make both nodes ready from the probe of the engine `engine_of` names for each: what the agent's probe reports.

    The runtime facts are the engine's own (`DockerRuntime.info`, as `agent.probe_node` sends them), but for the
    host's size: one CPU each keeps one replica of `_submit`'s gang on each node.
    """
    _world(world, NodeState.PROVISIONING)
    for node in Node.objects.filter(name__in=NODES):
        facts = asdict(DockerRuntime(engine_of[node.name], pull_images=False).info())
        report = {
            "agent_version": "test",
            "runtime": {**facts, "cpu_cores": 1, "memory_mib": 4_000},
            "gpus": {"available": False, "gpus": []},
            "health_check": {"exit_code": 0, "state": "exited", "message": ""},
        }
        ready = complete_provisioning(node_id=node.pk, attempt=node.provisioning_attempt, report=report)
        assert ready is not None and ready.state == NodeState.READY, ready and ready.state_reason


def _submit(world: World, image: str, command: list[str]) -> Workload:
    """Submit a gang of two replicas of one CPU each (so one on each node) as member A, and run a scheduling pass."""
    data = {
        "name": "gang",
        "image": image,
        "pool": world.pool,
        "command": command,
        "replicas": 2,
        "gpus_per_replica": 0,
        "cpu_milli": 1000,
        "memory_mib": 1024,
    }
    gang = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=data)
    run_pass_now()
    return gang


def _ended(gang: Workload) -> Workload | None:
    """Return the gang as it is now once it has ended, else None."""
    now = Workload.all_tenants.get(pk=gang.pk)
    return now if now.state in (WorkloadState.SUCCEEDED, WorkloadState.FAILED) else None


def _log_text(world: World, workload: Workload) -> list[str]:
    with tenant_scope(world.tenant_a):
        return [line["text"] for line in selectors.iter_log_lines(workload)]


def _events(workload: Workload) -> str:
    return "; ".join(f"{e.to_state} {e.message}" for e in WorkloadEvent.all_tenants.filter(workload_id=workload.pk))


PROBE = (
    "nc -l -p 29500 & sleep 0.3; "
    "if nc -w 3 127.0.0.1 29500 </dev/null; then echo 'control reached'; else echo 'control refused'; fi; "
    'for target in "$@"; do '
    'if nc -w 3 "$target" 29500 </dev/null; then echo "reached $target"; else echo "refused $target"; fi; done'
)


def _probe(runtime: DockerRuntime, tenant: str, name: str, image: str, targets: list[str]) -> list[str]:
    """Run a container of `tenant` (on its own network, as the runtime puts it) that dials rank 0; return its output."""
    spec = WorkloadSpec(
        name=name,
        workload_id=str(900_000 + sum(map(ord, name))),
        tenant=tenant,
        attempt=0,
        image=image,
        command=["sh", "-c", PROBE, "probe", *targets],
        installation=installation_id(),  # a tenant of the same console as the gang
    )
    handle = runtime.start(spec)
    assert wait_until(lambda: runtime.poll(handle).state == "exited", timeout=60), f"probe {name} did not end"
    verdicts = ("control ", "reached ", "refused ")  # nc's own complaints on stderr are left out
    lines = [line.text for line in runtime.logs(handle) if line.text.startswith(verdicts)]
    runtime.remove(handle)
    return lines


def _gang_addresses(url: str, container: str, network: str) -> tuple[str, str]:
    """Return replica 0's address on its gang overlay and on the host's egress bridge (docker_gwbridge)."""
    attrs = json.loads(_docker(url, "inspect", container))[0]
    overlay = attrs["NetworkSettings"]["Networks"][network]["IPAddress"]
    bridge = json.loads(_docker(url, "network", "inspect", "docker_gwbridge"))[0]
    # The endpoint is named after the container's sandbox (`gateway_<id>`); on this host only rank 0 has one.
    ids = {attrs["Id"][:12], str(attrs["NetworkSettings"].get("SandboxID"))[:12]}
    gateways = [entry for entry in (bridge.get("Containers") or {}).values() if entry["Name"].startswith("gateway_")]
    named = [entry for entry in gateways if entry["Name"].removeprefix("gateway_") in ids] or gateways
    assert len(named) == 1, f"rank 0's egress endpoint: {gateways}"
    egress = str(named[0]["IPv4Address"]).split("/")[0]
    return overlay, egress


@pytest.mark.multihost
def test_a_gang_on_two_hosts_all_reduces_over_its_own_overlay_and_no_one_else_reaches_it(
    world: World, gang_agent: dict[str, DockerRuntime], engines: list[str], test_image: str
) -> None:
    _world(world)
    submitted = time.monotonic()
    gang = _submit(world, TORCH_IMAGE, ["python3", "-c", RANK_SCRIPT])

    def reduced() -> list[str]:
        return [line for line in _log_text(world, gang) if " all_reduce " in line]

    assert wait_until(lambda: len(reduced()) == 2, timeout=240), f"no all-reduce from both ranks: {_events(gang)}"
    print(f"\nsubmitted to both all-reduce lines: {time.monotonic() - submitted:.1f} s")
    for line in sorted(reduced()):
        print(line)
        assert "all_reduce [3.0, 30.0] expected [3.0, 30.0] ok True" in line
    placed = sorted(Replica.all_tenants.filter(workload=gang).values_list("node__name", flat=True))
    assert placed == sorted(NODES), "one replica on each host"

    network = policy.gang_network_name(installation_id(), str(gang.pk), gang.attempt)
    rank0 = container_name(gang.pk, 0, gang.attempt)
    master_url = next(url for url in engines if rank0 in _docker(url, "ps", "--format", "{{.Names}}"))
    master_host = HOST_ADDRESSES[engines.index(master_url)]
    overlay, egress = _gang_addresses(master_url, rank0, network)
    assert all(f"master {rank0}:29500" in line for line in reduced()), "rank 0 is found by its name on the overlay"
    targets = [rank0, overlay, egress, master_host]
    runtimes = list(gang_agent.values())
    prober = gang_agent[NODES[engines.index(master_url)]]
    probes = {  # at once: all within the ranks' hold of the port
        "tenant-b on host 1": (runtimes[0], world.tenant_b.slug, "probe-b-h1"),
        "tenant-b on host 2": (runtimes[1], world.tenant_b.slug, "probe-b-h2"),
        "tenant-a non-gang, rank 0's host": (prober, world.tenant_a.slug, "probe-a"),
    }
    with ThreadPoolExecutor(len(probes)) as pool:
        running = {who: pool.submit(_probe, *args, test_image, targets) for who, args in probes.items()}
        outsiders = {who: future.result() for who, future in running.items()}
    still = Workload.all_tenants.get(pk=gang.pk).state
    assert still == WorkloadState.RUNNING, "the probes ran while rank 0 held its rendezvous port"
    for who, lines in outsiders.items():
        print(f"{who}: {lines}")
        assert lines[0] == "control reached", f"{who}: the probe itself works"
        assert lines[1:] == [f"refused {target}" for target in targets], f"{who} reached the gang: {lines}"

    gang = Workload.all_tenants.get(pk=gang.pk)
    assert wait_until(
        lambda: Workload.all_tenants.get(pk=gang.pk).state in (WorkloadState.SUCCEEDED, WorkloadState.FAILED),
        timeout=HOLD_SECONDS + 60,
    ), _events(gang)
    gang = Workload.all_tenants.get(pk=gang.pk)
    assert gang.state == WorkloadState.SUCCEEDED, f"every rank checked its result: {_events(gang)}"
    rendezvous = [float(re.search(r"rendezvous ([\d.]+) s", line)[1]) for line in reduced()]  # type: ignore[index]
    print(f"rendezvous (init_process_group) per rank: {rendezvous} s")

    # The gang's network goes with it: its containers' stop or removal on the manager, or the next prune.
    for runtime in runtimes:
        for managed in runtime.list_managed():
            runtime.remove(managed.handle)
    manager = engines[0]
    assert wait_until(lambda: network not in _docker(manager, "network", "ls", "--format", "{{.Name}}"), timeout=30)


# --- where the scheduler puts a gang across hosts -----------------------------------


@pytest.mark.multihost
def test_each_engine_reports_its_swarm_by_one_key_and_its_role(engines: list[str]) -> None:
    manager, worker = (DockerRuntime(url, pull_images=False).info() for url in engines)
    alone = DockerRuntime(LOCAL_ENGINE, pull_images=False).info()
    assert manager.swarm and manager.swarm == worker.swarm, "a worker and its manager report the same swarm"
    assert (manager.swarm_manager, worker.swarm_manager) == (True, False)
    assert (alone.swarm, alone.swarm_manager) == ("", False), "the machine's own engine is in no swarm"


@pytest.mark.multihost
def test_a_gang_spreads_over_hosts_probed_in_one_swarm_with_a_manager_and_runs(
    world: World, tmp_path: Path, engines: list[str], test_image: str
) -> None:
    _probed(world, dict(zip(NODES, engines, strict=True)))
    assert sorted(Node.objects.filter(name__in=NODES).values_list("swarm_manager", flat=True)) == [False, True]
    with _agents(tmp_path, engines):
        gang = _submit(world, test_image, ["sh", "-c", "echo rank $RANK of $WORLD_SIZE"])
        assert wait_until(lambda: _ended(gang), timeout=90), _events(gang)
    ended = Workload.all_tenants.get(pk=gang.pk)
    assert ended.state == WorkloadState.SUCCEEDED, _events(gang)
    placed = sorted(Replica.all_tenants.filter(workload=gang).values_list("node__name", flat=True))
    assert placed == sorted(NODES), "one replica on each host"
    assert sorted(_log_text(world, gang)) == ["rank 0 of 2", "rank 1 of 2"]


@pytest.mark.multihost
def test_a_gang_waits_saying_why_rather_than_spreading_over_swarm_workers_alone(
    world: World, engines: list[str], test_image: str
) -> None:
    # Both nodes probed from the swarm's worker: spread over them, no replica could make the gang's network.
    _probed(world, dict.fromkeys(NODES, engines[1]))
    gang = _submit(world, test_image, ["true"])
    waiting = Workload.all_tenants.get(pk=gang.pk)
    assert waiting.state == WorkloadState.PENDING
    assert waiting.reason_code == ReasonCode.GANG_CANNOT_FIT
    assert SPAN_NOTE in waiting.reason_message, waiting.reason_message
    assert not Replica.all_tenants.filter(workload=gang).exists(), "nothing was placed"


# --- failure paths of the gang network -------------------------------------------

_ids = iter(range(int(time.time()) % 100_000 * 10 + 800_000_000, 10**10))


def _gang_spec(image: str, *, replica: int = 0, workload_id: str = "", tenant: str = "tenant-g") -> WorkloadSpec:
    """A replica of a gang across hosts that sleeps; a fresh workload id unless `workload_id` is given."""
    workload = workload_id or str(next(_ids))
    return WorkloadSpec(
        name=policy.container_name(TEST_INSTALLATION, workload, replica, 0),
        installation=TEST_INSTALLATION,
        workload_id=workload,
        tenant=tenant,
        attempt=0,
        replica=replica,
        image=image,
        command=["sleep", "300"],
        gang_across_hosts=True,
    )


def _containers_of(url: str, workload_id: str) -> list[str]:
    listed = _docker(
        url, "ps", "-a", "--filter", f"label={policy.LABEL_WORKLOAD}={workload_id}", "--format", "{{.Names}}"
    )
    return listed.split()


def _network_names(url: str) -> set[str]:
    return set(_docker(url, "network", "ls", "--format", "{{.Name}}").split())


def test_an_engine_in_no_swarm_refuses_a_gang_replica_with_no_swarm(test_image: str) -> None:
    assert _docker(LOCAL_ENGINE, "info", "--format", "{{.Swarm.LocalNodeState}}").strip() == "inactive", (
        "this test needs the machine's own engine outside any swarm"
    )
    spec = _gang_spec(test_image)
    with pytest.raises(PermanentDriverError) as refused:
        DockerRuntime(LOCAL_ENGINE, pull_images=False).start(spec)
    assert refused.value.code == "no_swarm"
    assert _containers_of(LOCAL_ENGINE, spec.workload_id) == [], "nothing was made"


def test_a_gang_across_hosts_on_engines_in_no_swarm_fails_with_that_reason(
    world: World, tmp_path: Path, test_image: str
) -> None:
    _world(world)
    with _agents(tmp_path, [LOCAL_ENGINE, LOCAL_ENGINE]):
        gang = _submit(world, test_image, ["sleep", "300"])
        assert wait_until(lambda: _ended(gang), timeout=60), _events(gang)
    ended = Workload.all_tenants.get(pk=gang.pk)
    assert ended.state == WorkloadState.FAILED, _events(gang)
    assert ended.reason_code == ReasonCode.LAUNCH_FAILED
    assert "Docker engine is in no swarm" in ended.reason_message, ended.reason_message
    assert _containers_of(LOCAL_ENGINE, str(gang.pk)) == []


@pytest.mark.multihost
def test_a_gang_with_no_replica_on_a_manager_fails_with_gang_network_missing_after_the_wait(
    world: World, tmp_path: Path, engines: list[str], test_image: str
) -> None:
    _world(world)
    worker = engines[1]
    began = time.monotonic()
    with _agents(tmp_path, [worker, worker], gang_network_wait=2.0):
        gang = _submit(world, test_image, ["sleep", "300"])
        assert wait_until(lambda: _ended(gang), timeout=60), _events(gang)
    took = time.monotonic() - began
    ended = Workload.all_tenants.get(pk=gang.pk)
    print(f"\nsubmitted to failed (gang_network_missing, 2 s wait): {took:.1f} s")
    assert ended.state == WorkloadState.FAILED, _events(gang)
    assert "no replica of the gang on a swarm manager made it within 2 s" in ended.reason_message, _events(gang)
    assert took < 40, "the injected wait, not the default 60 s"
    assert wait_until(lambda: _containers_of(worker, str(gang.pk)) == [], timeout=30), "no refused container is left"


@pytest.mark.multihost
def test_idle_gang_networks_past_the_grace_are_pruned_and_young_used_or_foreign_ones_are_not(
    engines: list[str], test_image: str
) -> None:
    manager_url = engines[0]
    manager = DockerRuntime(manager_url, pull_images=False)
    idle, used, foreign = (policy.gang_network_name(TEST_INSTALLATION, str(next(_ids)), 0) for _ in range(3))
    gang = ["--label", f"{policy.LABEL_PURPOSE}={policy.GANG_PURPOSE}"]
    managed = ["--label", f"{policy.LABEL_MANAGED}={policy.MANAGED}"]
    for name, labels in ((idle, gang + managed), (used, gang + managed), (foreign, gang)):
        _docker(manager_url, "network", "create", "-d", "overlay", "--attachable", *labels, name)
    holder = _docker(manager_url, "run", "-d", "--network", used, test_image, "sleep", "300").strip()
    try:
        gangs = GangNetworks(manager._api)
        assert gangs.prune_idle(Budget(30)) == 0 or idle in _network_names(manager_url), "young ones stay"
        assert {idle, used, foreign} <= _network_names(manager_url)
        assert gangs.prune_idle(Budget(30), now=time.time() + IDLE_GRACE_SECONDS + 5) >= 1
        left = _network_names(manager_url)
        assert idle not in left, "idle past the grace: pruned"
        assert used in left, "a container uses it"
        assert foreign in left, "not the product's"
    finally:
        _docker(manager_url, "rm", "-f", holder)
        for name in (used, foreign):
            subprocess.run([docker_cli(), "-H", manager_url, "network", "rm", name], capture_output=True, check=False)


@pytest.mark.multihost
def test_a_managers_release_while_another_hosts_container_is_attached_is_refused_and_tolerated(
    engines: list[str], test_image: str
) -> None:
    manager, worker = (DockerRuntime(url, pull_images=False) for url in engines)
    first = _gang_spec(test_image)
    second = _gang_spec(test_image, replica=1, workload_id=first.workload_id)
    network = policy.gang_network_name(TEST_INSTALLATION, first.workload_id, 0)
    on_manager = manager.start(first)
    on_worker = worker.start(second)
    try:
        manager.remove(on_manager)  # releases the network: the swarm refuses, the worker's replica still uses it
        assert network in _network_names(engines[0]), "the swarm kept the network while a container is on it"
        assert worker.poll(on_worker).state == "running"
    finally:
        worker.remove(on_worker)  # a worker leaves the network to a manager
    gangs = GangNetworks(manager._api)

    def released() -> bool:
        gangs.release(network, Budget(30))
        return network not in _network_names(engines[0])

    assert wait_until(released, timeout=30), "the last one out (or a later release) removes it"


@pytest.mark.multihost
def test_a_network_of_the_gangs_name_but_another_tenants_is_never_joined(engines: list[str], test_image: str) -> None:
    manager, worker = (DockerRuntime(url, pull_images=False) for url in engines)
    spec = _gang_spec(test_image, tenant="tenant-g")
    network = policy.gang_network_name(TEST_INSTALLATION, spec.workload_id, 0)
    labels = {
        policy.LABEL_MANAGED: policy.MANAGED,
        policy.LABEL_PURPOSE: policy.GANG_PURPOSE,
        policy.LABEL_TENANT: "tenant-other",
        policy.LABEL_WORKLOAD: spec.workload_id,
        policy.LABEL_ATTEMPT: "0",
    }
    flags = [flag for key, value in labels.items() for flag in ("--label", f"{key}={value}")]
    _docker(engines[0], "network", "create", "-d", "overlay", "--attachable", *flags, network)
    try:
        for runtime, url, replica in ((manager, engines[0], 0), (worker, engines[1], 1)):
            mine = _gang_spec(test_image, replica=replica, workload_id=spec.workload_id)
            with pytest.raises(PermanentDriverError) as refused:
                runtime.start(mine)
            assert refused.value.code == "name_conflict", url
            assert _containers_of(url, spec.workload_id) == [], f"{url}: no container is left on it"
    finally:
        _docker(engines[0], "network", "rm", network)
