"""Fixtures of the driver tests: a Docker client and tenant that clean up after themselves, spec builders.

Docker tests use the image of the `test_image` fixture (tests/conftest.py),
built locally from busybox-static when missing. Every container and network
a test creates carries its tenant's label and is removed when it ends.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import Any

import docker
import docker.errors
import pytest

from inventory.drivers import policy
from inventory.drivers.base import Resources, WorkloadSpec
from inventory.drivers.docker import API_VERSION, DockerRuntime
from inventory.drivers.health import HEALTH_CHECK_TENANT

SpecFactory = Callable[..., WorkloadSpec]

# One installation per pytest-xdist worker ("gw3" -> ...03), so workers sharing the engine never name the same
# container or network: its first 8 digits are the tag every name carries (policy.installation_tag).
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
TEST_INSTALLATION = f"7e57c{_WORKER:03x}00000000"
"""The installation id the driver tests' specs carry: their names and networks are this console's."""


def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> bool:
    """Poll `predicate` every 20 ms until it is truthy or `timeout` passes; return whether it became so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def new_spec(command: list[str], *, tenant: str, image: str = "unused", attempt: int = 1, **extra: Any) -> WorkloadSpec:
    """Return a spec for a fresh workload id (so names never collide between tests)."""
    workload = f"t{uuid.uuid4().hex[:10]}"
    replica = int(extra.pop("replica", 0))
    installation = str(extra.pop("installation", TEST_INSTALLATION))
    return WorkloadSpec(
        name=policy.container_name(installation, workload, replica, attempt),
        installation=installation,
        workload_id=workload,
        tenant=tenant,
        attempt=attempt,
        replica=replica,
        image=image,
        command=command,
        resources=extra.pop("resources", Resources(cpu_milli=500, memory_mib=64, pids=64)),
        **extra,
    )


def agent_spec(node: str, workload: int, tenant: str, image: str, command: list[str]) -> dict[str, Any]:
    """Return the controller's start message (JSON) of replica 0, attempt 1 of `workload` on the docker runtime."""
    return {
        "node": node,
        "runtime": "docker",
        "installation": TEST_INSTALLATION,
        "name": policy.container_name(TEST_INSTALLATION, workload, 0, 1),
        "workload_id": workload,
        "tenant": tenant,
        "attempt": 1,
        "replica": 0,
        "image": image,
        "command": command,
        "env": {},
    }


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url="unix:///var/run/docker.sock", version=API_VERSION, timeout=30)
    yield client
    client.close()


def remove_tenant(client: docker.DockerClient, tenant: str) -> None:
    """Force-remove every container of `tenant`, then its network."""
    for container in client.api.containers(all=True, filters={"label": f"{policy.LABEL_TENANT}={tenant}"}):
        with suppress(docker.errors.NotFound):
            client.api.remove_container(container["Id"], force=True)
    for network in client.api.networks(names=[policy.tenant_network_name(TEST_INSTALLATION, tenant)]):
        with suppress(docker.errors.NotFound):
            client.api.remove_network(network["Id"])


@pytest.fixture(scope="session")
def docker_tenant(docker_client: docker.DockerClient) -> Iterator[str]:
    """A tenant (and so a bridge network) for this session's Docker tests, removed at the end."""
    tenant = f"drivertest-{uuid.uuid4().hex[:8]}"
    yield tenant
    remove_tenant(docker_client, tenant)


@pytest.fixture
def fresh_tenant(docker_client: docker.DockerClient) -> Iterator[str]:
    """A tenant whose network does not exist yet, removed after the test."""
    tenant = f"drivertest-{uuid.uuid4().hex[:8]}"
    yield tenant
    remove_tenant(docker_client, tenant)


@pytest.fixture
def health_network(docker_client: docker.DockerClient) -> Iterator[str]:
    """The health checks' network: removed after the test unless it existed before."""
    name = policy.tenant_network_name(TEST_INSTALLATION, HEALTH_CHECK_TENANT)
    existed = bool(docker_client.api.networks(names=[name]))
    yield name
    if not existed:
        remove_tenant(docker_client, HEALTH_CHECK_TENANT)


@pytest.fixture
def runtime(docker_client: docker.DockerClient, docker_tenant: str) -> Iterator[DockerRuntime]:
    """A Docker runtime on the local engine; the test's containers are removed afterwards."""
    yield DockerRuntime()
    mine = {"label": f"{policy.LABEL_TENANT}={docker_tenant}"}
    for container in docker_client.api.containers(all=True, filters=mine):
        with suppress(docker.errors.NotFound):
            docker_client.api.remove_container(container["Id"], force=True)


@pytest.fixture
def docker_spec(docker_tenant: str, test_image: str) -> SpecFactory:
    """Build a spec running `command` in the test image for this session's tenant."""

    def make(command: list[str], **extra: Any) -> WorkloadSpec:
        extra.setdefault("tenant", docker_tenant)
        extra.setdefault("image", test_image)
        return new_spec(command, **extra)

    return make
