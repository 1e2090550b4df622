"""The production runtime: one hardened container per workload replica, through the Docker Engine API.

Every container gets the same defaults (see `container_config`): all
capabilities dropped, no-new-privileges, a pids, memory (no extra swap) and
CPU limit, tini as PID 1, an unprivileged user, the tenant's own bridge
network (a replica of a gang spread over hosts: its gang's own overlay,
`_gangs`), no host namespaces, and no host path but the volume directories
of the spec's mounts (prepared by `storage` before the container is made,
bound one by one, read-only where the mount says so; the engine must run
on the agent's host, which makes them). GPUs are granted by UUID
through a device request for the NVIDIA driver, and NVIDIA_VISIBLE_DEVICES
is always set (`void` without GPUs) so an image cannot ask the NVIDIA
runtime for more. A spec's service port, and only it, is published on the
runtime's `publish_address` at a host port the engine picks; the handle's
`endpoint` is read back from the running container, so an adopted one
gives the same.

Engine calls are bounded: each thread has its own client whose socket
timeout is set to what is left of the call's budget. Errors map to the
driver's: 4xx → PermanentDriverError, 5xx and connection failures →
TransientDriverError, socket timeouts → DriverTimeout.

`DockerRuntime` holds the driver methods and delegates to collaborators,
each in a module of its own: `_containers` (adopt or create and start
a container, runs the engine lost track of, status), `_networks` (the
tenants' bridges), `_gangs` (the overlays of gangs across hosts) and
`_logs` (reading and following output), over
`_engine` (budgets, errors, what inspect means) and `_config`
(the container request and its endpoint).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import Any

import docker
import docker.errors

from inventory.drivers import policy, sandbox
from inventory.drivers.base import (
    DEFAULT_TIMEOUT,
    DriverError,
    Handle,
    LogLine,
    ManagedWorkload,
    PermanentDriverError,
    PullListener,
    RuntimeInfo,
    WorkloadSpec,
    WorkloadStatus,
)
from inventory.drivers.docker._config import container_config, inspected_endpoint, listed_endpoint, publish_host
from inventory.drivers.docker._containers import LOST_RUN_NOTE, Containers
from inventory.drivers.docker._engine import (
    API_VERSION,
    DEFAULT_DOCKER_URL,
    STATES,
    Budget,
    container_id,
    engine_errors,
    toolkit_version,
    version_tuple,
)
from inventory.drivers.docker._gangs import GangNetworks, attach_refused, swarm_of
from inventory.drivers.docker._logs import ContainerLogs
from inventory.drivers.docker._networks import TenantNetworks, network_missing
from inventory.drivers.timestamps import parse_cursor

__all__ = ["LOST_RUN_NOTE", "DockerRuntime", "container_config", "publish_host"]

# How long a replica on a swarm worker waits for a replica of its gang on a manager to make the gang's network.
GANG_NETWORK_WAIT = 60.0


class DockerRuntime:
    """Runs workloads as hardened containers on the Docker engine at `base_url` (default: the local socket).

    `user` is the uid:gid every container runs as; `publish_address` is the
    IP address service ports are published on (see `publish_host`);
    `pull_images` lets start
    pull an image that is missing (off by default: a missing image is a
    PermanentDriverError `image_not_found`); `poll_stats` makes poll read
    one-shot stats for memory and CPU time (an extra call that Docker 20.10
    can hold for up to a second, so off by default); `encrypt_gang_networks`
    makes the overlays of gangs across hosts with IPsec (`_gangs`,
    off by default: docs/gangs.md); `gang_network_wait` is how long a
    replica on a swarm worker waits for its gang's network; `client_factory` builds
    the per-thread SDK client (tests use it to inject failures).
    """

    kind = "docker"

    def __init__(
        self,
        base_url: str | None = None,
        *,
        user: str = "1000:1000",
        publish_address: str = "127.0.0.1",
        pull_images: bool = False,
        poll_stats: bool = False,
        log_max_size: str = "50m",
        encrypt_gang_networks: bool = False,
        gang_network_wait: float = GANG_NETWORK_WAIT,
        client_factory: Callable[[], docker.DockerClient] | None = None,
    ) -> None:
        self.base_url = base_url or DEFAULT_DOCKER_URL
        self.user = user
        self.publish_address = publish_host(publish_address)
        self.pull_images = pull_images
        self.poll_stats = poll_stats
        self.log_max_size = log_max_size
        self._client_factory = client_factory or self._new_client
        self._local = threading.local()
        self._networks = TenantNetworks(self._api)
        self._gangs = GangNetworks(self._api, encrypted=encrypt_gang_networks)
        self.gang_network_wait = gang_network_wait
        self._containers = Containers(self, self._api, self._networks)
        self._logs = ContainerLogs(self._api, self._containers)

    def _new_client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.base_url, version=API_VERSION, timeout=int(DEFAULT_TIMEOUT))

    def _api(self, budget: Budget) -> docker.APIClient:
        """Return this thread's low-level client with its socket timeout set to what `budget` has left."""
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._client_factory()
            self._local.client = client
        api: docker.APIClient = client.api
        api.timeout = budget.left()  # type: ignore[assignment]  # the stub says int; requests takes float
        return api

    # --- start ----------------------------------------------------------------

    def start(
        self, spec: WorkloadSpec, *, timeout: float = DEFAULT_TIMEOUT, on_pull: PullListener | None = None
    ) -> Handle:
        """Create and start the container of `spec`, or adopt the one of the same name; return its handle.

        With a service port, the handle's `endpoint` is where it is
        published (none once the container has exited: nothing listens).
        Raises SpecRefused before any engine call when the environment, the
        service port, the mounts, user, working directory or stop signal
        are not allowed (`sandbox.check_sandbox`); a storage error
        (`storage`) when a volume cannot be prepared; PermanentDriverError `image_not_found` when the image
        is missing (and pulling is off), `name_conflict` when a container
        of that name belongs to another workload; TransientDriverError when
        the engine cannot be reached. A missing image is pulled (when
        `pull_images` is on) within `timeout`, and `on_pull` hears how it goes
        (see `Runtime.start`); a pull the registry refuses is
        PermanentDriverError `image_not_found`, one that breaks off
        TransientDriverError `pull_failed`. A replica of a gang across hosts
        joins its gang's overlay instead of the tenant's bridge: on an engine
        in no swarm that is PermanentDriverError `no_swarm`, and
        `gang_network_missing` when no replica of the gang on a manager made
        the network within `gang_network_wait` seconds (or the budget, if
        shorter), `name_conflict` when a network of its name is another's.
        """
        policy.check_environment(spec.env)
        policy.check_service_port(spec.service_port, spec.service_port_env)
        sandbox.check_sandbox(spec)
        policy.check_workload_name(spec.name)
        network = policy.tenant_network_name(spec.installation, spec.tenant)
        budget = Budget(timeout)
        with engine_errors(f"start {spec.name}"):
            if spec.gang_across_hosts:
                found = self._start_in_gang(spec, budget, on_pull)
                return self._started(found, spec)
            try:
                found = self._containers.create_and_start(spec, network, budget, on_pull)
            except docker.errors.NotFound as error:
                # Its network was removed after this runtime last saw it (pruned, or by hand): make it again, once.
                if not network_missing(error, network):
                    raise
                self._networks.forget(network)
                found = self._containers.create_and_start(spec, network, budget, on_pull)
        return self._started(found, spec)

    def _started(self, found: dict[str, Any], spec: WorkloadSpec) -> Handle:
        handle = self._handle(str(found["Id"]), spec)
        endpoint = inspected_endpoint(found, spec.service_port, self.publish_address)
        return handle | {"endpoint": endpoint} if endpoint else handle

    def _start_in_gang(self, spec: WorkloadSpec, budget: Budget, on_pull: PullListener | None) -> dict[str, Any]:
        """Start the replica on its gang's overlay; on a worker, wait until a manager's replica has made it."""
        network = self._gangs.ensure(spec, budget)
        wait = min(self.gang_network_wait, budget.left())
        deadline = time.monotonic() + wait
        while True:
            try:
                found = self._containers.create_and_start(spec, network, budget, on_pull)
                break
            except docker.errors.APIError as error:
                if not attach_refused(error, network):
                    raise
                if time.monotonic() >= deadline:
                    raise PermanentDriverError(
                        f"{spec.name} could not join its gang's network {network}: no replica of the gang on a"
                        f" swarm manager made it within {wait:g} s (docs/gangs.md)",
                        code="gang_network_missing",
                    ) from error
            time.sleep(max(min(0.5, deadline - time.monotonic()), 0.0))
        try:
            # A worker first sees the network when its container joins it: only now can it tell whose it is.
            self._gangs.check_owner(network, spec, budget)
        except PermanentDriverError:
            with suppress(docker.errors.APIError):
                self._api(budget).remove_container(str(found["Id"]), force=True)
            raise
        return found

    def _release_gang_network(self, attrs: dict[str, Any], budget: Budget) -> None:
        """Let the gang overlay of a stopped or removed container go, if it was on one (best effort)."""
        network = str((attrs.get("HostConfig") or {}).get("NetworkMode") or "")
        if network.startswith(policy.GANG_NETWORK_PREFIX):
            with suppress(DriverError, docker.errors.DockerException, OSError):
                self._gangs.release(network, budget)

    @staticmethod
    def _handle(container_id: str, spec: WorkloadSpec) -> Handle:
        return {
            "runtime": "docker",
            "id": container_id,
            "name": spec.name,
            "workload_id": spec.workload_id,
            "tenant": spec.tenant,
            "attempt": spec.attempt,
            "replica": spec.replica,
        }

    # --- poll, stop, remove ------------------------------------------------------

    def poll(self, handle: Handle, *, timeout: float = DEFAULT_TIMEOUT) -> WorkloadStatus:
        """Return the container's state, exit code and times; `missing` when it is gone.

        With `poll_stats`, a running container's memory and CPU time come
        from one one-shot stats read.
        """
        container = container_id(handle)
        budget = Budget(timeout)
        with engine_errors(f"poll {handle.get('name')}"):
            attrs = self._containers.inspect(container, budget)
            if attrs is None:
                return WorkloadStatus(state="missing")
            status = self._containers.status(container, attrs, budget)
            if self.poll_stats and status.state == "running":
                status = self._with_usage(container, status, budget)
        return status

    def _with_usage(self, container: str, status: WorkloadStatus, budget: Budget) -> WorkloadStatus:
        stats = self._api(budget).stats(container, stream=False, one_shot=True)
        memory = stats.get("memory_stats") or {}
        cache = (memory.get("stats") or {}).get("inactive_file", (memory.get("stats") or {}).get("cache", 0))
        usage = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
        return dataclasses.replace(
            status,
            memory_bytes=max(int(memory.get("usage", 0)) - int(cache), 0) if memory else None,
            cpu_seconds=usage["total_usage"] / 1e9 if "total_usage" in usage else None,
        )

    def stop(self, handle: Handle, *, grace_seconds: float = 30.0, timeout: float = DEFAULT_TIMEOUT) -> WorkloadStatus:
        """The spec's stop signal, SIGKILL after `grace_seconds` (Docker counts whole seconds); return the final status.

        The signal is the container's own (`stop_signal` of its create request), so an adopted one gets it too.

        Idempotent: an exited container is left as it is, a missing one
        gives `missing`. The call may take up to grace_seconds + timeout.
        """
        container = container_id(handle)
        grace = max(0, math.ceil(grace_seconds))
        budget = Budget(timeout + grace)
        with engine_errors(f"stop {handle.get('name')}"):
            api = self._api(budget)
            # The SDK adds the grace period to the socket timeout of this request.
            api.timeout = max(budget.left() - grace, 1.0)  # type: ignore[assignment]  # as in _api
            try:
                api.stop(container, timeout=grace)
            except docker.errors.NotFound:
                return WorkloadStatus(state="missing")
            attrs = self._containers.inspect(container, budget)
            if attrs is None:
                return WorkloadStatus(state="missing")
            self._containers.end_lost_task(attrs)
            self._release_gang_network(attrs, budget)
            return self._containers.status(container, attrs, budget)

    def remove(self, handle: Handle, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Kill the container if it runs and delete it with its logs; a missing one is fine."""
        container = container_id(handle)
        budget = Budget(timeout)
        with engine_errors(f"remove {handle.get('name')}"):
            attrs = self._containers.inspect(container, budget)
            if attrs is None:
                return
            self._containers.end_lost_task(attrs)
            try:
                self._api(budget).remove_container(container, force=True)
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as error:
                if error.status_code != 409:  # removal already in progress
                    raise
            self._release_gang_network(attrs, budget)

    # --- logs ----------------------------------------------------------------

    def logs(
        self, handle: Handle, *, since: str | None = None, follow: bool = False, timeout: float = DEFAULT_TIMEOUT
    ) -> Iterator[LogLine]:
        """Yield stdout and stderr lines in order, strictly after cursor `since`.

        A cursor is the line's RFC 3339 timestamp as Docker recorded it,
        with `#n` appended when n earlier lines share that timestamp, so
        resuming skips exactly what was seen. Each engine read is bounded by
        `timeout`; with `follow`, lines keep coming until the container
        exits, and DriverTimeout is raised if it still runs after `timeout`
        seconds (resume from the last cursor). Raises PermanentDriverError
        `not_found` for a missing container, `invalid_cursor` for a bad one.
        """
        container = container_id(handle)
        if since:
            parse_cursor(since)
        return self._logs.follow(container, since, follow, Budget(timeout), str(handle.get("name")))

    # --- list, info -------------------------------------------------------------

    def list_managed(self, *, timeout: float = DEFAULT_TIMEOUT) -> list[ManagedWorkload]:
        """Return every container labelled gpucloud.managed=1 on this engine, in any state, whoever owns it.

        Each carries the installation and node its labels name ("" when it
        has none); the caller keeps its own (`ManagedWorkload.owner`).
        """
        budget = Budget(timeout)
        with engine_errors("list containers"):
            label = f"{policy.LABEL_MANAGED}={policy.MANAGED}"
            found = self._api(budget).containers(all=True, filters={"label": label})
        managed = []
        for entry in found:
            labels = entry.get("Labels") or {}
            try:
                attempt, replica = int(labels[policy.LABEL_ATTEMPT]), int(labels[policy.LABEL_REPLICA])
                workload, tenant = labels[policy.LABEL_WORKLOAD], labels[policy.LABEL_TENANT]
            except (KeyError, ValueError):
                continue  # labelled by hand, not by a runtime
            name = str((entry.get("Names") or ["/"])[0]).lstrip("/")
            handle = {"runtime": "docker", "id": entry["Id"], "name": name, "workload_id": workload}
            handle |= {"tenant": tenant, "attempt": attempt, "replica": replica}
            endpoint = listed_endpoint(entry, self.publish_address)
            if endpoint:
                handle["endpoint"] = endpoint
            state = STATES.get(str(entry.get("State")), "exited")
            owner = labels.get(policy.LABEL_INSTALLATION, ""), labels.get(policy.LABEL_NODE, "")
            managed.append(ManagedWorkload(name, workload, tenant, attempt, replica, state, handle, *owner))
        return managed

    def info(self, *, timeout: float = DEFAULT_TIMEOUT) -> RuntimeInfo:
        """Return the engine, runc and (on a local engine) NVIDIA container toolkit versions and host capacity."""
        budget = Budget(timeout)
        with engine_errors("docker info"):
            api = self._api(budget)
            version, info = api.version(), api.info()
        components = {str(c.get("Name", "")).lower(): c.get("Version") for c in version.get("Components") or []}
        runtimes = info.get("Runtimes") or {}
        local = self.base_url.startswith(("unix://", "/"))
        swarm, role = swarm_of(info)
        return RuntimeInfo(
            kind=self.kind,
            isolated=True,
            engine_version=version.get("Version"),
            runc_version=components.get("runc") or (info.get("RuncCommit") or {}).get("ID") or None,
            nvidia_runtime="nvidia" in runtimes,
            device_requests=version_tuple(version.get("ApiVersion")) >= (1, 40),
            toolkit_version=toolkit_version(min(5.0, budget.left())) if local else None,
            cpu_cores=info.get("NCPU"),
            memory_mib=int(info["MemTotal"]) // (1024 * 1024) if info.get("MemTotal") else None,
            swarm=swarm,
            swarm_manager=role == "manager",
        )
