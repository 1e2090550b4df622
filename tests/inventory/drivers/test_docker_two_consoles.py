"""Two consoles on one real Docker engine: the same workload id and tenant slug never meet.

Each console names its containers and its tenants' bridges with its own
installation id (`policy.installation_tag`). Before, both consoles' first
replica of workload 1 was `gpucloud-w1-r0-a1` (the second start failed with
`name_conflict`), and tenant `acme` of each joined one bridge
`gpucloud-tenant-acme`, where their containers reached each other.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import docker
import pytest

from inventory.drivers import policy
from inventory.drivers.base import Handle, WorkloadSpec
from inventory.drivers.docker import DockerRuntime
from tests.inventory.drivers.conftest import new_spec, wait_for

pytestmark = pytest.mark.docker

CONSOLE_ONE, CONSOLE_TWO = "c0501e0100000000", "c0501e0200000000"
PORT = 7000
SERVE = ["sh", "-c", f"while true; do echo hello | nc -l -p {PORT}; done"]


@pytest.fixture
def shared_tenant(docker_client: docker.DockerClient) -> Iterator[str]:
    """One tenant slug both consoles have; every container and bridge of it, of either console, removed after."""
    tenant = f"twoconsoles-{uuid.uuid4().hex[:8]}"
    yield tenant
    for container in docker_client.api.containers(all=True, filters={"label": f"{policy.LABEL_TENANT}={tenant}"}):
        docker_client.api.remove_container(container["Id"], force=True)
    for installation in (CONSOLE_ONE, CONSOLE_TWO):
        for network in docker_client.api.networks(names=[policy.tenant_network_name(installation, tenant)]):
            docker_client.api.remove_network(network["Id"])


def _spec(installation: str, workload: str, tenant: str, image: str, command: list[str]) -> WorkloadSpec:
    spec = new_spec(command, tenant=tenant, image=image, installation=installation)
    # The same workload id on both consoles (each console's first workload is 1), named by its own console.
    return dataclasses.replace(spec, workload_id=workload, name=policy.container_name(installation, workload, 0, 1))


def _reaches(runtime: DockerRuntime, spec: WorkloadSpec, address: str) -> bool:
    """Run `spec` as a client that connects to `address`:PORT; return whether it got through."""
    probe = f"if nc -w 5 {address} {PORT} </dev/null | grep -q hello; then echo reached; else echo refused; fi"
    handle = runtime.start(dataclasses.replace(spec, command=["sh", "-c", probe]))
    assert wait_for(lambda: runtime.poll(handle).state == "exited", timeout=60)
    return [line.text for line in runtime.logs(handle)] == ["reached"]


def _address(client: docker.DockerClient, handle: Handle) -> tuple[str, str]:
    """Return the (only) network of `handle`'s container and its address there."""
    networks = client.api.inspect_container(handle["id"])["NetworkSettings"]["Networks"]
    assert len(networks) == 1
    ((network, settings),) = networks.items()
    return network, str(settings["IPAddress"])


def test_two_consoles_start_the_same_workload_of_the_same_tenant_apart(
    docker_client: docker.DockerClient, shared_tenant: str, test_image: str
) -> None:
    runtime = DockerRuntime(pull_images=False)
    workload = f"1{uuid.uuid4().hex[:6]}"  # unique to this run, the same on both consoles
    one = runtime.start(_spec(CONSOLE_ONE, workload, shared_tenant, test_image, SERVE))
    two = runtime.start(_spec(CONSOLE_TWO, workload, shared_tenant, test_image, SERVE))  # no name_conflict
    assert one["name"] != two["name"]
    (net_one, addr_one), (net_two, addr_two) = _address(docker_client, one), _address(docker_client, two)
    assert net_one == policy.tenant_network_name(CONSOLE_ONE, shared_tenant)
    assert net_two == policy.tenant_network_name(CONSOLE_TWO, shared_tenant) != net_one
    assert wait_for(lambda: runtime.poll(one).state == "running" and runtime.poll(two).state == "running")

    # The same console's next replica of the tenant reaches its server: the probe can tell "reached".
    neighbour = f"2{uuid.uuid4().hex[:6]}"
    assert _reaches(runtime, _spec(CONSOLE_ONE, neighbour, shared_tenant, test_image, []), addr_one)
    assert _reaches(runtime, _spec(CONSOLE_TWO, neighbour, shared_tenant, test_image, []), addr_two)
    # Across consoles, the same tenant slug is no way in: neither reaches the other's server.
    other = f"3{uuid.uuid4().hex[:6]}"
    assert not _reaches(runtime, _spec(CONSOLE_ONE, other, shared_tenant, test_image, []), addr_two)
    assert not _reaches(runtime, _spec(CONSOLE_TWO, other, shared_tenant, test_image, []), addr_one)
