"""The Docker runtime against the real engine: lifecycle, logs, stop, adoption, hardening, failures."""

from __future__ import annotations

import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import docker
import docker.errors
import httpx
import pytest

from inventory.drivers import policy, run_health_check
from inventory.drivers.base import (
    DriverTimeout,
    Handle,
    PermanentDriverError,
    Resources,
    RuntimeInfo,
    TransientDriverError,
    WorkloadSpec,
)
from inventory.drivers.docker import DockerRuntime, container_config, publish_host
from inventory.drivers.policy import SpecRefused
from inventory.drivers.timestamps import parse_ns
from tests.inventory.drivers.conftest import TEST_INSTALLATION, SpecFactory, new_spec, remove_tenant, wait_for

pytestmark = pytest.mark.docker

TRAPS_TERM = "trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
IGNORES_TERM = "trap '' TERM; echo ready; while :; do sleep 0.05; done"


def texts(runtime: DockerRuntime, handle: dict[str, Any], **kwargs: Any) -> list[str]:
    return [line.text for line in runtime.logs(handle, **kwargs)]


def exited(runtime: DockerRuntime, handle: dict[str, Any]) -> bool:
    return runtime.poll(handle).state == "exited"


def test_lifecycle_from_running_to_the_exit_code(runtime: DockerRuntime, docker_spec: SpecFactory) -> None:
    handle = runtime.start(docker_spec(["sh", "-c", "sleep 0.5; exit 3"]))
    running = runtime.poll(handle)
    assert running.state == "running" and running.exit_code is None and running.started_at
    assert wait_for(lambda: exited(runtime, handle))
    status = runtime.poll(handle)
    assert (status.state, status.exit_code) == ("exited", 3)
    assert status.started_at and status.finished_at and status.finished_at > status.started_at


def test_logs_keep_both_streams_apart_and_resume_after_any_cursor(
    runtime: DockerRuntime, docker_spec: SpecFactory
) -> None:
    script = "echo o1; echo e1 >&2; printf 'a\\nb\\nc\\n'; echo e2 >&2; printf 'no newline'"
    handle = runtime.start(docker_spec(["sh", "-c", script]))
    assert wait_for(lambda: exited(runtime, handle))
    lines = list(runtime.logs(handle))
    # Docker stamps each stream as it reads it, so only the order within a stream is the program's.
    assert [line.text for line in lines if line.stream == "stdout"] == ["o1", "a", "b", "c", "no newline"]
    assert [line.text for line in lines if line.stream == "stderr"] == ["e1", "e2"]
    assert [parse_ns(line.timestamp) for line in lines] == sorted(parse_ns(line.timestamp) for line in lines)
    assert len({line.cursor for line in lines}) == len(lines)
    for seen, line in enumerate(lines):
        assert list(runtime.logs(handle, since=line.cursor)) == lines[seen + 1 :], f"resuming after {line.text}"


def test_follow_streams_until_the_container_exits(runtime: DockerRuntime, docker_spec: SpecFactory) -> None:
    handle = runtime.start(docker_spec(["sh", "-c", "for i in 1 2 3 4; do echo $i; sleep 0.2; done"]))
    first = next(iter(runtime.logs(handle, follow=True, timeout=10)))
    assert first.text == "1"
    assert texts(runtime, handle, since=first.cursor, follow=True, timeout=10) == ["2", "3", "4"]
    assert runtime.poll(handle).state == "exited"


def test_follow_gives_up_with_a_timeout_while_the_container_runs(
    runtime: DockerRuntime, docker_spec: SpecFactory
) -> None:
    handle = runtime.start(docker_spec(["sh", "-c", "echo started; sleep 30"]))
    seen: list[str] = []
    began = time.monotonic()
    with pytest.raises(DriverTimeout):
        seen.extend(line.text for line in runtime.logs(handle, follow=True, timeout=1.0))
    assert seen == ["started"]
    assert time.monotonic() - began < 3


def test_stop_lets_a_workload_that_handles_sigterm_exit_cleanly(
    runtime: DockerRuntime, docker_spec: SpecFactory
) -> None:
    handle = runtime.start(docker_spec(["sh", "-c", TRAPS_TERM]))
    assert wait_for(lambda: "ready" in texts(runtime, handle))
    began = time.monotonic()
    status = runtime.stop(handle, grace_seconds=10)
    assert (status.state, status.exit_code) == ("exited", 0)
    assert time.monotonic() - began < 5, "it exited on SIGTERM, long before the grace period"
    assert texts(runtime, handle)[-1] == "bye"


def test_stop_kills_a_workload_that_ignores_sigterm_after_the_grace_period(
    runtime: DockerRuntime, docker_spec: SpecFactory
) -> None:
    handle = runtime.start(docker_spec(["sh", "-c", IGNORES_TERM]))
    assert wait_for(lambda: "ready" in texts(runtime, handle))
    began = time.monotonic()
    status = runtime.stop(handle, grace_seconds=1)
    elapsed = time.monotonic() - began
    assert (status.state, status.exit_code) == ("exited", 137)
    assert 0.9 <= elapsed < 5


def test_stop_is_idempotent_on_exited_and_missing_containers(runtime: DockerRuntime, docker_spec: SpecFactory) -> None:
    handle = runtime.start(docker_spec(["true"]))
    assert wait_for(lambda: exited(runtime, handle))
    assert runtime.stop(handle, grace_seconds=1) == runtime.poll(handle)
    runtime.remove(handle)
    runtime.remove(handle)  # again: already gone is fine
    assert runtime.stop(handle).state == "missing"
    assert runtime.poll(handle).state == "missing"
    with pytest.raises(PermanentDriverError) as gone:
        list(runtime.logs(handle))
    assert gone.value.code == "not_found"


def test_a_retried_start_adopts_the_container_instead_of_creating_another(
    runtime: DockerRuntime, docker_spec: SpecFactory, docker_client: docker.DockerClient
) -> None:
    spec = docker_spec(["sleep", "30"])
    first = runtime.start(spec)
    again = DockerRuntime().start(spec)  # as a restarted agent would
    assert again == first
    named = docker_client.api.containers(all=True, filters={"name": spec.name})
    assert [c["Id"] for c in named] == [first["id"]]


def test_an_exited_container_is_adopted_not_restarted(runtime: DockerRuntime, docker_spec: SpecFactory) -> None:
    spec = docker_spec(["sh", "-c", "echo once"])
    handle = runtime.start(spec)
    assert wait_for(lambda: exited(runtime, handle))
    assert runtime.start(spec) == handle
    assert texts(runtime, handle) == ["once"]


def test_concurrent_starts_of_one_spec_race_safely_to_one_container_and_one_network(
    fresh_tenant: str, test_image: str, docker_client: docker.DockerClient
) -> None:
    spec = new_spec(["sleep", "30"], tenant=fresh_tenant, image=test_image)
    handles: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            handles.append(DockerRuntime().start(spec))
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len({h["id"] for h in handles}) == 1
    assert len(docker_client.api.containers(all=True, filters={"name": spec.name})) == 1
    networks = docker_client.api.networks(names=[policy.tenant_network_name(TEST_INSTALLATION, fresh_tenant)])
    assert [n["Name"] for n in networks] == [policy.tenant_network_name(TEST_INSTALLATION, fresh_tenant)]


@pytest.fixture
def new_tenant(docker_client: docker.DockerClient) -> Iterator[Callable[[], str]]:
    """Make fresh tenant names; every container and network of them is removed after the test."""
    made: list[str] = []

    def make() -> str:
        made.append(f"drivertest-{uuid.uuid4().hex[:8]}")
        return made[-1]

    yield make
    for tenant in made:
        remove_tenant(docker_client, tenant)


def exhausted_once(api: docker.APIClient) -> docker.APIClient:
    """Make `api`'s next network creation fail as an engine whose address pools are used up does."""
    create = api.create_network
    calls = {"n": 0}

    def refuse_first(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            message = "could not find an available, non-overlapping IPv4 address pool among the defaults"
            raise docker.errors.APIError("404", explanation=message)
        return create(*args, **kwargs)

    api.create_network = refuse_first  # type: ignore[method-assign]
    return api


def test_used_up_address_pools_free_the_subnets_of_idle_tenant_bridges_only(
    new_tenant: Callable[[], str], test_image: str, docker_client: docker.DockerClient
) -> None:
    idle, busy, newcomer = new_tenant(), new_tenant(), new_tenant()
    runtime = DockerRuntime()
    finished = runtime.start(new_spec(["true"], tenant=idle, image=test_image))
    assert wait_for(lambda: exited(runtime, finished))
    runtime.remove(finished)
    running = runtime.start(new_spec(["sleep", "30"], tenant=busy, image=test_image))

    def client() -> docker.DockerClient:
        real = docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=30)
        exhausted_once(real.api)
        return real

    handle = DockerRuntime(client_factory=client).start(new_spec(["sleep", "30"], tenant=newcomer, image=test_image))

    def exists(tenant: str) -> bool:
        return bool(docker_client.api.networks(names=[policy.tenant_network_name(TEST_INSTALLATION, tenant)]))

    assert runtime.poll(handle).state == "running"
    assert not exists(idle)
    assert exists(busy) and runtime.poll(running).state == "running"
    assert exists(newcomer)


def test_a_tenant_bridge_removed_behind_the_runtime_is_made_again(
    fresh_tenant: str, test_image: str, docker_client: docker.DockerClient
) -> None:
    runtime = DockerRuntime()
    first = runtime.start(new_spec(["true"], tenant=fresh_tenant, image=test_image))
    assert wait_for(lambda: exited(runtime, first))
    runtime.remove(first)
    for network in docker_client.api.networks(names=[policy.tenant_network_name(TEST_INSTALLATION, fresh_tenant)]):
        docker_client.api.remove_network(network["Id"])
    second = runtime.start(new_spec(["sleep", "30"], tenant=fresh_tenant, image=test_image))
    assert runtime.poll(second).state == "running"
    assert docker_client.api.networks(names=[policy.tenant_network_name(TEST_INSTALLATION, fresh_tenant)])


def test_a_start_the_engine_died_in_is_made_afresh_at_once(
    docker_spec: SpecFactory, docker_client: docker.DockerClient
) -> None:
    # What an engine killed between creating and starting a container answers afterwards: containerd
    # still has a task of that container's id.
    spec = docker_spec(["sh", "-c", "echo fresh"])
    refused: list[str] = []

    def client() -> docker.DockerClient:
        real = docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=30)
        start = real.api.start

        def stale_once(container: str, *args: Any, **kwargs: Any) -> Any:
            if not refused:
                refused.append(container)
                raise docker.errors.APIError("500", explanation=f"task {container}: already exists")
            return start(container, *args, **kwargs)

        real.api.start = stale_once  # type: ignore[method-assign,assignment]
        return real

    runtime = DockerRuntime(client_factory=client)
    handle = runtime.start(spec)
    assert refused and handle["id"] != refused[0]
    assert wait_for(lambda: exited(runtime, handle))
    assert texts(runtime, handle) == ["fresh"]
    assert [c["Id"] for c in docker_client.api.containers(all=True, filters={"name": spec.name})] == [handle["id"]]


def test_a_name_held_by_another_workload_is_a_conflict(runtime: DockerRuntime, docker_spec: SpecFactory) -> None:
    spec = docker_spec(["sleep", "30"])
    runtime.start(spec)
    impostor = WorkloadSpec(**{**spec.__dict__, "workload_id": "someone-else"})
    with pytest.raises(PermanentDriverError) as conflict:
        runtime.start(impostor)
    assert conflict.value.code == "name_conflict"


def test_list_managed_finds_running_and_exited_containers(runtime: DockerRuntime, docker_spec: SpecFactory) -> None:
    running = runtime.start(docker_spec(["sleep", "30"], replica=2, attempt=4))
    done = runtime.start(docker_spec(["true"]))
    assert wait_for(lambda: exited(runtime, done))
    found = {m.name: m for m in runtime.list_managed()}
    assert found[running["name"]].state == "running"
    assert found[done["name"]].state == "exited"
    mine = found[running["name"]]
    assert (mine.workload_id, mine.attempt, mine.replica, mine.handle) == (
        running["workload_id"],
        4,
        2,
        running,
    )


def test_the_container_is_created_hardened(
    runtime: DockerRuntime, docker_spec: SpecFactory, docker_client: docker.DockerClient, docker_tenant: str
) -> None:
    spec = docker_spec(["sleep", "30"], resources=Resources(cpu_milli=1500, memory_mib=96, pids=77), env={"A": "1"})
    handle = runtime.start(spec)
    attrs = docker_client.api.inspect_container(handle["id"])
    host, config = attrs["HostConfig"], attrs["Config"]
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Privileged"] is False
    assert host["PidsLimit"] == 77
    assert host["Memory"] == host["MemorySwap"] == 96 * 1024 * 1024
    assert host["NanoCpus"] == 1_500_000_000
    assert host["NetworkMode"] == policy.tenant_network_name(TEST_INSTALLATION, docker_tenant)
    assert host["PidMode"] in ("", "private") and host["IpcMode"] == "private" and host["UTSMode"] == ""
    assert not host["Binds"] and not host.get("Mounts") and not attrs["Mounts"]
    assert not host["Devices"] and not host.get("DeviceRequests")
    assert host["Init"] is True
    assert config["User"] == "1000:1000"
    assert "NVIDIA_VISIBLE_DEVICES=void" in config["Env"] and "A=1" in config["Env"]
    assert policy.identity_matches(
        config["Labels"], policy.managed_labels(spec.workload_id, spec.tenant, spec.attempt, spec.replica)
    )
    assert list(attrs["NetworkSettings"]["Networks"]) == [policy.tenant_network_name(TEST_INSTALLATION, docker_tenant)]
    whoami = runtime.start(docker_spec(["id", "-u"]))
    assert wait_for(lambda: exited(runtime, whoami))
    assert texts(runtime, whoami) == ["1000"]


def test_dev_shm_has_the_size_the_spec_asks_for_else_the_engines_default(
    runtime: DockerRuntime, docker_spec: SpecFactory, docker_client: docker.DockerClient
) -> None:
    df = ["df", "-k", "/dev/shm"]  # noqa: S108 -- the container's own tmpfs, measured, never written here
    sized = runtime.start(docker_spec(df, resources=Resources(memory_mib=96, shm_mib=48)))
    unset = runtime.start(docker_spec(df, resources=Resources(memory_mib=96)))
    assert docker_client.api.inspect_container(sized["id"])["HostConfig"]["ShmSize"] == 48 * 1024 * 1024
    assert docker_client.api.inspect_container(unset["id"])["HostConfig"]["ShmSize"] == 64 * 1024 * 1024
    assert wait_for(lambda: exited(runtime, sized) and exited(runtime, unset))
    # busybox df: "Filesystem 1K-blocks Used Available Use% Mounted on", then the tmpfs's line.
    assert texts(runtime, sized)[-1].split()[1] == str(48 * 1024)
    assert texts(runtime, unset)[-1].split()[1] == str(64 * 1024)


def test_gpus_are_requested_by_uuid_through_a_device_request() -> None:
    gpus = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]
    spec = new_spec(["nvidia-smi"], tenant="acme", image="cuda", gpu_uuids=gpus)
    config = container_config(spec, user="1000:1000", network=policy.tenant_network_name(TEST_INSTALLATION, "acme"))
    assert config["host_config"]["DeviceRequests"] == [
        {"Driver": "nvidia", "Count": 0, "DeviceIDs": gpus, "Capabilities": [["gpu"]], "Options": {}}
    ]
    assert config["environment"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(gpus)
    assert config["host_config"]["Privileged"] is False and config["host_config"]["CapDrop"] == ["ALL"]
    without = container_config(
        new_spec(["true"], tenant="acme"),
        user="1000:1000",
        network=policy.tenant_network_name(TEST_INSTALLATION, "acme"),
    )
    assert "DeviceRequests" not in without["host_config"]
    assert without["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_gpus_on_an_engine_without_the_nvidia_toolkit_are_refused_and_leave_nothing(
    runtime: DockerRuntime, docker_spec: SpecFactory, docker_client: docker.DockerClient
) -> None:
    info = runtime.info()
    if info.nvidia_runtime or info.toolkit_version or shutil.which("nvidia-container-runtime-hook"):
        pytest.skip("this engine has the NVIDIA container toolkit")
    spec = docker_spec(["true"], gpu_uuids=["GPU-11111111-2222-3333-4444-555555555555"])
    with pytest.raises(PermanentDriverError) as refused:
        runtime.start(spec)
    assert refused.value.code == "nvidia_toolkit_missing"
    assert docker_client.api.containers(all=True, filters={"name": spec.name}) == []


# busybox httpd serving one page that names the port the runtime told it to listen on.
HTTPD = 'mkdir -p /tmp/w && echo "served on $HTTP_PORT" > /tmp/w/index.html && exec httpd -f -p "$HTTP_PORT" -h /tmp/w'


def fetch(endpoint: str, path: str = "/index.html") -> str | None:
    """Return the body `endpoint` serves at `path`, or None while nothing answers there."""
    try:
        response = httpx.get(endpoint + path, timeout=2)
    except httpx.TransportError:
        return None
    return response.text if response.status_code == 200 else None


def test_a_service_port_is_published_on_the_loopback_and_answers_at_the_endpoint(
    runtime: DockerRuntime, docker_spec: SpecFactory, docker_client: docker.DockerClient
) -> None:
    spec = docker_spec(["sh", "-c", HTTPD], service_port=8080, service_port_env="HTTP_PORT")
    handle = runtime.start(spec)
    endpoint = handle["endpoint"]
    assert endpoint.startswith("http://127.0.0.1:") and endpoint != "http://127.0.0.1:8080"
    assert wait_for(lambda: fetch(endpoint) == "served on 8080\n")
    host = docker_client.api.inspect_container(handle["id"])["HostConfig"]
    assert host["PortBindings"] == {"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}]}
    assert host["PublishAllPorts"] is False and host["CapDrop"] == ["ALL"] and host["Privileged"] is False


def test_an_adopted_or_listed_container_gives_the_same_endpoint(
    runtime: DockerRuntime, docker_spec: SpecFactory
) -> None:
    spec = docker_spec(["sh", "-c", HTTPD], service_port=8080, service_port_env="HTTP_PORT")
    handle = runtime.start(spec)
    assert DockerRuntime().start(spec) == handle  # as a restarted agent would
    listed: dict[str, Handle] = {m.name: m.handle for m in DockerRuntime().list_managed()}
    assert listed[spec.name] == handle
    runtime.stop(handle, grace_seconds=0)
    assert "endpoint" not in runtime.start(spec), "an exited container serves nothing"


def test_a_container_without_a_service_port_publishes_nothing(
    runtime: DockerRuntime, docker_spec: SpecFactory, docker_client: docker.DockerClient
) -> None:
    handle = runtime.start(docker_spec(["sleep", "30"]))
    assert "endpoint" not in handle
    attrs = docker_client.api.inspect_container(handle["id"])
    assert not attrs["HostConfig"]["PortBindings"] and not attrs["NetworkSettings"]["Ports"]
    config = container_config(
        new_spec(["true"], tenant="acme"),
        user="1000:1000",
        network=policy.tenant_network_name(TEST_INSTALLATION, "acme"),
    )
    assert "PortBindings" not in config["host_config"] and config["ports"] is None


def test_the_service_port_is_published_on_the_configured_address_only() -> None:
    spec = new_spec(["jupyter"], tenant="acme", service_port=8888, service_port_env="JUPYTER_PORT")
    config = container_config(spec, user="1000:1000", network="n", publish_address="10.1.2.3")
    assert config["host_config"]["PortBindings"] == {"8888/tcp": [{"HostIp": "10.1.2.3", "HostPort": ""}]}
    assert config["ports"] == [8888] and config["environment"]["JUPYTER_PORT"] == "8888"
    assert DockerRuntime(publish_address="10.1.2.3").publish_address == "10.1.2.3"
    for wildcard_or_name in ("0.0.0.0", "::", "node1.example.com", ""):  # noqa: S104 -- refusing it is the point
        with pytest.raises(PermanentDriverError) as refused:
            publish_host(wildcard_or_name)
        assert refused.value.code == "invalid_publish_address"


@pytest.mark.parametrize(
    ("port", "env", "field"),
    [
        (0, "", "service_port"),
        (70000, "", "service_port"),
        (None, "PORT", "service_port_env"),
        (80, "LD_X", "service_port_env"),
    ],
)
def test_a_bad_service_port_stops_start_before_any_engine_call(port: int | None, env: str, field: str) -> None:
    runtime = DockerRuntime(client_factory=lambda: Exploding())  # type: ignore[arg-type,return-value]
    with pytest.raises(SpecRefused) as refused:
        runtime.start(new_spec(["true"], tenant="acme", service_port=port, service_port_env=env))
    assert refused.value.field == field


class Exploding:
    """A client that fails the test if the runtime touches it at all."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the engine was called ({name}) before the spec was checked")


@pytest.mark.parametrize("name", ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD"])
def test_a_refused_environment_stops_start_before_any_engine_call(name: str) -> None:
    made: list[object] = []

    def factory() -> Any:
        made.append(Exploding())
        return made[-1]

    runtime = DockerRuntime(client_factory=factory)
    with pytest.raises(SpecRefused) as refused:
        runtime.start(new_spec(["true"], tenant="acme", env={name: "all"}))
    assert (refused.value.field, refused.value.rule) == (f"env.{name}", "forbidden_env")
    assert made == []


def test_a_missing_image_is_a_permanent_error_and_is_not_pulled(
    runtime: DockerRuntime, docker_spec: SpecFactory, docker_client: docker.DockerClient
) -> None:
    spec = docker_spec(["true"], image="gpucloud-test/does-not-exist:latest")
    with pytest.raises(PermanentDriverError) as missing:
        runtime.start(spec)
    assert missing.value.code == "image_not_found"
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.api.inspect_image("gpucloud-test/does-not-exist:latest")


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP port that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_an_unreachable_engine_is_a_transient_error_within_the_timeout(silent_server: str) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused_url = f"tcp://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    handle = {"runtime": "docker", "id": "0123456789ab", "name": "x"}
    for url in ("unix:///nonexistent/docker.sock", refused_url):
        began = time.monotonic()
        with pytest.raises(TransientDriverError) as down:
            DockerRuntime(url).poll(handle, timeout=2)
        assert down.value.code == "engine_unreachable"
        assert time.monotonic() - began < 2
    began = time.monotonic()
    with pytest.raises(DriverTimeout):
        DockerRuntime(silent_server).start(new_spec(["true"], tenant="acme", image="x"), timeout=0.5)
    assert time.monotonic() - began < 2


def test_info_reports_engine_runc_and_gpu_support(runtime: DockerRuntime) -> None:
    info = runtime.info()
    assert isinstance(info, RuntimeInfo)
    assert (info.kind, info.isolated, info.simulated) == ("docker", True, False)
    assert info.engine_version and info.runc_version
    assert info.device_requests is True  # every engine this runtime speaks to is API 1.40+
    assert info.nvidia_runtime is ("nvidia" in docker.from_env(version="1.41").info()["Runtimes"])
    assert info.cpu_cores and info.cpu_cores > 0 and info.memory_mib and info.memory_mib > 0


@pytest.mark.usefixtures("health_network")
def test_the_health_check_reports_the_exit_code_and_output_and_leaves_nothing(
    runtime: DockerRuntime, test_image: str, docker_client: docker.DockerClient
) -> None:
    failed = run_health_check(
        runtime,
        installation=TEST_INSTALLATION,
        image=test_image,
        command=["sh", "-c", "echo broken >&2; exit 2"],
        gpu_uuids=[],
        timeout=30,
    )
    assert (failed.state, failed.exit_code, failed.message) == ("exited", 2, "broken")
    passed = run_health_check(
        runtime, installation=TEST_INSTALLATION, image=test_image, command=["true"], gpu_uuids=[], timeout=30
    )
    assert (passed.state, passed.exit_code) == ("exited", 0)
    leftovers = docker_client.api.containers(all=True, filters={"label": "gpucloud.purpose=health-check"})
    assert leftovers == []


@pytest.mark.usefixtures("health_network")
def test_a_health_check_that_overruns_is_killed_and_says_so(runtime: DockerRuntime, test_image: str) -> None:
    status = run_health_check(
        runtime, installation=TEST_INSTALLATION, image=test_image, command=["sleep", "30"], gpu_uuids=[], timeout=1.0
    )
    assert status.state == "exited" and status.exit_code != 0
    assert "did not finish within 1 s" in status.message
