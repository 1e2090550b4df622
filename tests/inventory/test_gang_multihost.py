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

Needs root, iproute2, dockerd and debootstrap; marked `docker`, so CI
(which requires docker) fails rather than skips when the hosts cannot be
built.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from inventory.agent import executor as executor_module
from inventory.agent.config import AgentConfig, activate
from inventory.drivers import policy
from inventory.drivers.base import WorkloadSpec
from inventory.drivers.docker_runtime import DockerRuntime
from inventory.models import Gpu, agent_queue_for
from jobs import selectors, services
from jobs.choices import WorkloadState
from jobs.models import Replica, Workload, WorkloadEvent
from tenants.context import Actor
from tenants.scoping import tenant_scope
from tests.conftest import REQUIRED, ROOT, World
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota, run_pass_now
from tests.workers import running_worker, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

TORCH_IMAGE = "gpucloud-test/torch:latest"
NODES = ("gang-host-1", "gang-host-2")
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


def _hosts_missing() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces and extra Docker engines need root"
    absent = [tool for tool in ("ip", "dockerd", "docker", "debootstrap") if shutil.which(tool) is None]
    return f"missing {', '.join(absent)}" if absent else None


def _docker_cli() -> str:
    return shutil.which("docker") or "docker"


def _docker(url: str, *args: str, timeout: float = 60) -> str:
    done = subprocess.run(
        [_docker_cli(), "-H", url, *args], capture_output=True, text=True, timeout=timeout, check=True
    )
    return done.stdout


@pytest.fixture(scope="module")
def engines(test_image: str) -> Iterator[list[str]]:
    """Two engines in one swarm (host 1 the manager), each holding the torch and busybox test images."""
    reason = _hosts_missing()
    if reason:
        if "docker" in REQUIRED:
            pytest.fail(f"the multi-host gang test cannot build its hosts: {reason}", pytrace=False)
        pytest.skip(reason)
    subprocess.run([str(ROOT / ".ci" / "build-torch-image"), TORCH_IMAGE], check=True, timeout=900)
    state = tempfile.mkdtemp(prefix="gpucloud-multihost-")
    script = str(ROOT / ".ci" / "multihost-engines")
    try:
        up = subprocess.run([script, "up", state, "2"], capture_output=True, text=True, timeout=180, check=False)
        assert up.returncode == 0, f"multihost-engines up failed: {up.stderr}"
        urls = up.stdout.split()
        for url in urls:
            for image in (TORCH_IMAGE, test_image):
                with subprocess.Popen([_docker_cli(), "save", image], stdout=subprocess.PIPE) as save:
                    subprocess.run([_docker_cli(), "-H", url, "load"], stdin=save.stdout, check=True, timeout=300)
        yield urls
    finally:
        subprocess.run([script, "down", state], timeout=120, check=False)


@pytest.fixture
def gang_agent(tmp_path: Any, engines: list[str]) -> Iterator[dict[str, DockerRuntime]]:
    """The agents of both nodes in this process; each node's runtime drives that node's engine."""
    config = AgentConfig(node=NODES[0], work_dir=tmp_path, pull_images=False, probe="simulated")
    activate(config)
    executor = executor_module.Executor(config)
    runtimes = {node: DockerRuntime(url, pull_images=False) for node, url in zip(NODES, engines, strict=True)}
    for node, runtime in runtimes.items():
        executor._runtimes[("docker", node)] = runtime  # each node's agent has its own engine: one per host
    executor_module._executor = executor
    with running_worker(["control", "ingest", *(agent_queue_for(node) for node in NODES)], concurrency=4):
        yield runtimes
    executor_module._executor = None


def _world(world: World) -> None:
    give_quota(world)
    assign(world.member_a, world.project_a)
    for node_name, address in zip(NODES, HOST_ADDRESSES, strict=True):
        node = make_node(
            Actor(user=world.operator),
            world.pool,
            name=node_name,
            runtime="docker",
            address=address,
            cpu_cores=1,
            memory_mb=4_000,
        )
        Gpu.objects.create(node=node, index=0, uuid=f"GPU-{node_name}-0", model="NVIDIA H100 80GB HBM3")


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


def test_a_gang_on_two_hosts_all_reduces_over_its_own_overlay_and_no_one_else_reaches_it(
    world: World, gang_agent: dict[str, DockerRuntime], engines: list[str], test_image: str
) -> None:
    _world(world)
    data = {
        "name": "allreduce",
        "image": TORCH_IMAGE,
        "pool": world.pool,
        "command": ["python3", "-c", RANK_SCRIPT],
        "replicas": 2,
        "gpus_per_replica": 0,
        "cpu_milli": 1000,
        "memory_mib": 1024,
    }
    submitted = time.monotonic()
    gang = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=data)
    run_pass_now()

    def reduced() -> list[str]:
        return [line for line in _log_text(world, gang) if " all_reduce " in line]

    assert wait_until(lambda: len(reduced()) == 2, timeout=240), f"no all-reduce from both ranks: {_events(gang)}"
    print(f"\nsubmitted to both all-reduce lines: {time.monotonic() - submitted:.1f} s")
    for line in sorted(reduced()):
        print(line)
        assert "all_reduce [3.0, 30.0] expected [3.0, 30.0] ok True" in line
    placed = sorted(Replica.all_tenants.filter(workload=gang).values_list("node__name", flat=True))
    assert placed == sorted(NODES), "one replica on each host"

    network = policy.gang_network_name(str(gang.pk), gang.attempt)
    rank0 = f"gpucloud-w{gang.pk}-r0-a{gang.attempt}"
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
