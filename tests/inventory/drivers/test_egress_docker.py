"""Egress of workload containers, for real: the host's own services and metadata addresses are out of reach.

A TCP listener on the host, bound to 0.0.0.0, answers on every host address:
a container started through the real Docker runtime cannot connect to it on
the bridge's gateway nor on the host's own address once the agent's rules
are in (`inventory.drivers.egress`), and can once an operator allows that
destination. 169.254.169.254 is refused at once by a rule of ours.
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import docker
import pytest

from inventory.agent.config import AgentConfig, config_from_settings
from inventory.agent.egress import keep_egress
from inventory.drivers import egress, policy
from inventory.drivers.docker import DockerRuntime
from tests.inventory.drivers.conftest import TEST_INSTALLATION, new_spec, wait_for

pytestmark = pytest.mark.docker


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP service on the host bound to 0.0.0.0 (every host address); yield its port."""
    server = socket.create_server(("0.0.0.0", 0))  # noqa: S104 -- the exposure under test
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with closing(conn):
                conn.sendall(b"hello\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join(timeout=2)
    server.close()


@pytest.fixture
def rules() -> Iterator[None]:
    """The agent's egress rules, removed (with a warning, as always) after the test: the engine is shared."""
    egress.install_egress()
    yield
    egress.remove_egress("the egress test is over")


def _host_address() -> str | None:
    """Return an address of this host outside loopback and Docker's bridges (eth0's, say), or None."""
    ip = shutil.which("ip") or "/usr/sbin/ip"
    listed = subprocess.run([ip, "-4", "-o", "addr"], capture_output=True, text=True, timeout=10, check=True)
    for line in listed.stdout.splitlines():
        name, address = line.split()[1], line.split()[3].split("/")[0]
        if name != "lo" and not name.startswith(("docker", "br-", egress.BRIDGE_PREFIX, "veth")):
            return address
    return None


def _gateway(client: docker.DockerClient, tenant: str) -> str:
    network = client.api.inspect_network(policy.tenant_network_name(TEST_INSTALLATION, tenant))
    assert network["Options"].get("com.docker.network.bridge.name", "").startswith(egress.BRIDGE_PREFIX)
    return str(network["IPAM"]["Config"][0]["Gateway"])


def _probe(runtime: DockerRuntime, tenant: str, image: str, targets: list[tuple[str, int]]) -> dict[str, str]:
    """Run one workload container that connects to each target; return {target: reached | refused}."""
    script = "; ".join(
        f"if nc -w 5 {host} {port} </dev/null >/dev/null 2>&1; then echo {host}:{port}=reached; "
        f"else echo {host}:{port}=refused; fi"
        for host, port in targets
    )
    handle = runtime.start(new_spec(["sh", "-c", script], tenant=tenant, image=image))
    assert wait_for(lambda: runtime.poll(handle).state == "exited", timeout=60)
    lines = [line.text for line in runtime.logs(handle)]
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_a_workload_cannot_reach_the_hosts_own_services_unless_allowed(
    docker_client: docker.DockerClient, fresh_tenant: str, test_image: str, listener: int, rules: None
) -> None:
    runtime = DockerRuntime()
    runtime.start(new_spec(["sleep", "1"], tenant=fresh_tenant, image=test_image))  # makes the tenant's bridge
    targets = [(_gateway(docker_client, fresh_tenant), listener)]
    host = _host_address()
    if host is not None:
        targets.append((host, listener))
    # Without the rules a container reaches it: what the rules take away is really there.
    egress.remove_egress("showing the exposure the rules close")
    assert set(_probe(runtime, fresh_tenant, test_image, targets).values()) == {"reached"}
    egress.install_egress()
    assert set(_probe(runtime, fresh_tenant, test_image, targets).values()) == {"refused"}
    allowed = egress.parse_allowed(f"{address}/32:{port}" for address, port in targets)
    egress.install_egress(allowed)
    assert set(_probe(runtime, fresh_tenant, test_image, targets).values()) == {"reached"}


def test_metadata_and_link_local_addresses_are_refused_at_once(fresh_tenant: str, test_image: str, rules: None) -> None:
    listed = egress.installed()
    assert "-A GPUCLOUD-FORWARD -d 169.254.0.0/16 -p tcp -j REJECT --reject-with tcp-reset" in listed
    assert f"-A DOCKER-USER -i {egress.BRIDGE_PREFIX}+ -j {egress.FORWARD_CHAIN}" in listed
    runtime = DockerRuntime()
    began = time.monotonic()
    found = _probe(runtime, fresh_tenant, test_image, [("169.254.169.254", 80), ("169.254.1.1", 443)])
    assert found == {"169.254.169.254:80": "refused", "169.254.1.1:443": "refused"}
    assert time.monotonic() - began < 5  # a reset, not a 5 s connect timeout per target


def test_rules_are_idempotent_and_put_back_when_something_removed_them(
    rules: None, caplog: pytest.LogCaptureFixture
) -> None:
    assert egress.install_egress() is False  # already as they should be: nothing changes
    before = egress.installed()
    iptables = shutil.which("iptables") or "/usr/sbin/iptables"
    subprocess.run([iptables, "-F", egress.INPUT_CHAIN], check=True, timeout=10)  # someone flushes it
    with caplog.at_level("WARNING", logger="inventory.drivers.egress"):
        assert egress.install_egress() is True
    assert egress.installed() == before
    assert "egress rules had changed or gone missing; put back" in caplog.text


@pytest.mark.parametrize("entry", ["10.0.0.5:80x", "nonsense", "10.0.0.0/8", "10.0.0.0/8:0"])
def test_an_allowance_must_be_cidr_and_port(entry: str) -> None:
    with pytest.raises(ValueError, match="not CIDR:PORT"):
        egress.parse_allowed([entry])


def test_bridge_names_fit_linux_and_match_the_rules() -> None:
    name = egress.bridge_name(policy.tenant_network_name(TEST_INSTALLATION, "a-very-long-tenant-slug-indeed"))
    assert len(name) <= 15 and name.startswith(egress.BRIDGE_PREFIX)
    assert ipaddress.ip_network(str(egress.parse_allowed(["[fd00::1]:80"])[0].network)).version == 6


def test_the_agent_keeps_them_when_its_configuration_asks(tmp_path: Path, rules: None) -> None:
    assert config_from_settings("n1").egress_rules is True  # every agent the environment describes
    assert keep_egress(AgentConfig(node="n1", work_dir=tmp_path)) is None  # built in a test: not asked
    asking = AgentConfig(node="n1", work_dir=tmp_path, egress_rules=True, egress_allowed=("10.9.9.9/32:3128",))
    assert keep_egress(asking) is True  # the allowance is new
    assert "-A GPUCLOUD-INPUT -d 10.9.9.9/32 -p tcp -m tcp --dport 3128 -j RETURN" in egress.installed()
    assert keep_egress(asking) is False  # a reconcile with nothing changed
