"""The production runtime: one hardened container per workload replica, through the Docker Engine API.

Every container gets the same defaults (see `container_config`): all
capabilities dropped, no-new-privileges, a pids, memory (no extra swap) and
CPU limit, tini as PID 1, an unprivileged user, the tenant's own bridge
network, no host namespaces and no host paths. GPUs are granted by UUID
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
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from typing import Any

import docker
import docker.errors
import docker.types

from inventory.drivers import policy
from inventory.drivers.base import (
    DEFAULT_TIMEOUT,
    DriverTimeout,
    Handle,
    LogLine,
    ManagedWorkload,
    PermanentDriverError,
    RuntimeInfo,
    Stream,
    TransientDriverError,
    WorkloadSpec,
    WorkloadStatus,
)
from inventory.drivers.docker_config import (
    container_config,
    inspected_endpoint,
    listed_endpoint,
    publish_host,
)
from inventory.drivers.docker_engine import (
    API_VERSION,
    DEFAULT_DOCKER_URL,
    STATES,
    Budget,
    container_id,
    engine_errors,
    host_lock,
    kill_container_processes,
    networks_named,
    status_from,
    toolkit_version,
    version_tuple,
)
from inventory.drivers.timestamps import CursorFilter, parse_cursor, parse_ns

__all__ = ["DockerRuntime", "container_config", "publish_host"]

_FOLLOW_INTERVAL = 0.25
LOST_RUN_NOTE = (
    "It ran while the node's container engine restarted, and the engine lost track of it:"
    " its output is kept, but how it ended is not known."
)


def _frames(chunks: Iterable[bytes], stream: Stream) -> Iterator[tuple[int, str, Stream, str]]:
    """Yield (ns, timestamp, stream, text) from log frames, one message each, prefixed with a timestamp."""
    for chunk in chunks:
        stamp, _, text = chunk.decode("utf-8", "replace").partition(" ")
        yield parse_ns(stamp), stamp, stream, text.removesuffix("\n")


def _close(streams: Iterable[Any]) -> None:
    for stream in streams:
        with suppress(Exception):
            stream.close()


def _pools_exhausted(error: docker.errors.APIError) -> bool:
    """Whether the engine refused a network because no address pool has a free subnet left."""
    return "available, non-overlapping" in str(error.explanation or error)


def _stale_task(error: docker.errors.APIError) -> bool:
    """Whether a start failed because containerd still has a task of the container (an interrupted start).

    Docker 20.10 says "task ... already exists" or "id already in use",
    depending on how far the interrupted start had gone.
    """
    text = str(error.explanation or error)
    return ("task" in text and "already exists" in text) or "id already in use" in text


def _network_missing(error: docker.errors.APIError, network: str) -> bool:
    """Whether the engine refused a container because its network `network` does not exist.

    Engines before API 1.44 accept the container and refuse at its start; later ones refuse the creation.
    """
    text = str(error.explanation or error)
    return "network" in text and network in text


class DockerRuntime:
    """Runs workloads as hardened containers on the Docker engine at `base_url` (default: the local socket).

    `user` is the uid:gid every container runs as; `publish_address` is the
    IP address service ports are published on (see `publish_host`);
    `pull_images` lets start
    pull an image that is missing (off by default: a missing image is a
    PermanentDriverError `image_not_found`); `poll_stats` makes poll read
    one-shot stats for memory and CPU time (an extra call that Docker 20.10
    can hold for up to a second, so off by default); `client_factory` builds
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
        self._networks: set[str] = set()
        self._network_lock = threading.Lock()

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

    def start(self, spec: WorkloadSpec, *, timeout: float = DEFAULT_TIMEOUT) -> Handle:
        """Create and start the container of `spec`, or adopt the one of the same name; return its handle.

        With a service port, the handle's `endpoint` is where it is
        published (none once the container has exited: nothing listens).
        Raises SpecRefused before any engine call when the environment or
        the service port is not allowed; PermanentDriverError `image_not_found` when the image
        is missing (and pulling is off), `name_conflict` when a container
        of that name belongs to another workload; TransientDriverError when
        the engine cannot be reached.
        """
        policy.check_environment(spec.env)
        policy.check_service_port(spec.service_port, spec.service_port_env)
        policy.check_workload_name(spec.name)
        network = policy.tenant_network_name(spec.tenant)
        budget = Budget(timeout)
        with engine_errors(f"start {spec.name}"):
            try:
                found = self._create_and_start(spec, network, budget)
            except docker.errors.NotFound as error:
                # Its network was removed after this runtime last saw it (pruned, or by hand): make it again, once.
                if not _network_missing(error, network):
                    raise
                self._networks.discard(network)
                found = self._create_and_start(spec, network, budget)
        handle = self._handle(str(found["Id"]), spec)
        endpoint = inspected_endpoint(found, spec.service_port, self.publish_address)
        return handle | {"endpoint": endpoint} if endpoint else handle

    def _create_and_start(self, spec: WorkloadSpec, network: str, budget: Budget) -> dict[str, Any]:
        """Adopt or create the container of `spec` and start it unless it already ran; return its attributes.

        An engine that dies in the middle of a start can leave containerd
        running the container while the engine, restarted, still lists it as
        created (it never recorded the start). Such a run is never started a
        second time beside or after itself: a created container found with
        output already ran (`_lost_run`), and one whose start the engine
        refuses because containerd still has its task is ended first
        (`_after_lost_start`).
        """
        found = self._inspect(spec.name, budget)
        adopted = found is not None
        if found is None:
            found = self._create(spec, network, budget)
        self._check_identity(found, spec)
        if (found.get("State") or {}).get("Status") != "created":
            return found
        container = str(found["Id"])
        if adopted and self._lost_run(container, budget):
            return found
        try:
            self._api(budget).start(container)
        except docker.errors.APIError as error:
            if not _stale_task(error):
                self._discard(container)
                raise
            found, started = self._after_lost_start(container, spec, network, budget)
            if not started:
                return found
        if spec.service_port is not None:
            # The engine picks the host port when the container starts; only inspect tells it.
            found = self._inspect(str(found["Id"]), budget) or found
        return found

    def _lost_run(self, container: str, budget: Budget) -> bool:
        """Whether a created container already ran, unseen by the engine; if so, make sure it is over.

        Only a run writes output, and an engine that saw the run would list
        the container as running or exited: output under `created` is a run
        the engine lost. It is ended (if it still runs) and left as it is:
        `poll` reports it exited with its exit code unknown, its output kept.
        """
        if not self._has_output(container, budget):
            return False
        self._kill_lost(container)
        return True

    def _after_lost_start(
        self, container: str, spec: WorkloadSpec, network: str, budget: Budget
    ) -> tuple[dict[str, Any], bool]:
        """Deal with a created container whose start is refused because containerd still has a task of it.

        Returns the attributes of the container that stands for the replica
        now, and whether it is a fresh one just started.

        Its run is ended through its cgroups (the Engine API can reach a
        task only of a container it knows runs). If it printed anything, it
        is left for `poll` to report as a lost run; if it printed nothing,
        it is removed and a fresh container (a new id: Docker 20.10 stores
        every line twice when a container's stale task is restarted) is
        made and started. Raises TransientDriverError while a run that
        cannot be reached from this host may still be running: the job is
        never run twice at the same time.
        """
        ended = self._kill_lost(container)
        attrs = self._inspect(container, budget)
        if attrs is not None and self._lost_run(container, budget):
            return attrs, False
        if not ended:
            raise TransientDriverError(
                f"a run of {spec.name} that the engine lost track of may still be running, out of this host's reach;"
                " it is not started again until that run ends"
            )
        self._discard(container)
        found = self._create(spec, network, budget)
        self._check_identity(found, spec)
        try:
            self._api(budget).start(str(found["Id"]))
        except docker.errors.APIError:
            self._discard(str(found["Id"]))
            raise
        return found, True

    def _end_lost_task(self, attrs: dict[str, Any]) -> None:
        """End whatever containerd still runs of a container the engine lists as created (a start it lost).

        The engine's stop and forced removal act only on a container it
        knows runs: removing this one would leave its process running with
        no container to show for it. A no-op for any other state.
        """
        if (attrs.get("State") or {}).get("Status") == "created":
            self._kill_lost(str(attrs["Id"]))

    def _kill_lost(self, container: str) -> bool | None:
        """Kill what runs of `container` through its cgroups; None when this host cannot see them.

        Only an engine on this host's socket shares its cgroups with us.
        """
        return kill_container_processes(container) if self.base_url.startswith("unix://") else None

    def _discard(self, container: str) -> None:
        """Remove a container that did not start, so that a retry starts afresh (a failure is left to reconcile)."""
        with suppress(Exception):
            self._api(Budget(10.0)).remove_container(container, force=True)

    def _has_output(self, container: str, budget: Budget) -> bool:
        try:
            tail = self._api(budget).logs(container, stdout=True, stderr=True, tail=1)
        except docker.errors.NotFound:
            return False
        return bool(tail)

    def _inspect(self, name: str, budget: Budget) -> dict[str, Any] | None:
        try:
            attrs: dict[str, Any] = self._api(budget).inspect_container(name)
        except docker.errors.NotFound:
            return None
        return attrs

    def _create(self, spec: WorkloadSpec, network: str, budget: Budget) -> dict[str, Any]:
        """Create the container; on a name conflict (a concurrent start) return the winner's attributes."""
        self._ensure_network(network, spec.tenant, budget)
        config = container_config(
            spec, user=self.user, network=network, log_max_size=self.log_max_size, publish_address=self.publish_address
        )
        try:
            created = self._create_pulling(config, budget)
        except docker.errors.APIError as error:
            if error.status_code != 409:
                raise
            found = self._await_winner(spec.name, budget)
            if found is None:
                raise
            return found
        return {"Id": created["Id"], "Config": {"Labels": config["labels"]}, "State": {"Status": "created"}}

    def _await_winner(self, name: str, budget: Budget) -> dict[str, Any] | None:
        """Return the attributes of the container a concurrent creator is making under `name`, or None.

        The engine reserves a name before the container can be inspected, so
        the loser of a race may briefly see neither: wait for it (at most
        the budget, and never more than 5 s).
        """
        deadline = time.monotonic() + min(5.0, budget.left())
        while True:
            found = self._inspect(name, budget)
            if found is not None or time.monotonic() >= deadline:
                return found
            time.sleep(0.05)

    def _create_pulling(self, config: dict[str, Any], budget: Budget) -> dict[str, Any]:
        try:
            created: dict[str, Any] = self._api(budget).create_container(**config)
        except docker.errors.ImageNotFound as error:
            if not self.pull_images:
                raise PermanentDriverError(
                    f"image {config['image']} is not on this node and pulling is off", code="image_not_found"
                ) from error
            self._api(budget).pull(config["image"])
            created = self._api(budget).create_container(**config)
        return created

    def _ensure_network(self, network: str, tenant: str, budget: Budget) -> None:
        """Create the tenant's bridge unless it exists; concurrent creators end up sharing one.

        Engines before API 1.44 check duplicate names only best-effort, so
        racing creators can each make one: all of them then keep the oldest
        and remove the others (which nothing can have joined yet).
        """
        if network in self._networks:
            return
        with self._network_lock, host_lock(f"docker-network-{network}"):
            api = self._api(budget)
            if not networks_named(api, network):
                labels = {policy.LABEL_MANAGED: policy.MANAGED, policy.LABEL_TENANT: tenant}
                try:
                    self._create_network(api, network, labels, budget)
                except docker.errors.APIError as error:
                    if error.status_code != 409:
                        raise
                for extra in networks_named(api, network)[1:]:
                    if (extra.get("Labels") or {}).get(policy.LABEL_MANAGED) == policy.MANAGED:
                        with suppress(docker.errors.APIError):
                            api.remove_network(extra["Id"])
            self._networks.add(network)

    def _create_network(self, api: docker.APIClient, network: str, labels: dict[str, str], budget: Budget) -> None:
        """Create a bridge; when the engine's address pools are used up, prune idle tenant bridges and try once more.

        Each bridge takes a subnet from the engine's pools (31 with Docker's
        defaults), so a host that served more tenants than that over its life
        would refuse every new one while bridges of tenants with nothing
        running hold the subnets.
        """
        try:
            api.create_network(network, driver="bridge", labels=labels, check_duplicate=True)
        except docker.errors.APIError as error:
            if not _pools_exhausted(error) or not self._prune_idle_networks(budget, keep=network):
                raise
            api.create_network(network, driver="bridge", labels=labels, check_duplicate=True)

    def _prune_idle_networks(self, budget: Budget, *, keep: str) -> int:
        """Remove this product's bridges that no container is attached to (except `keep`); return how many.

        Each is checked and removed under its creation lock, so no creator on
        this host is between making it and attaching to it; one whose lock is
        busy is skipped (waiting could deadlock with a creator pruning the
        other way round). A container created after the removal finds its
        network gone and makes it again (`_create`).
        """
        api = self._api(budget)
        managed = api.networks(filters={"label": f"{policy.LABEL_MANAGED}={policy.MANAGED}", "driver": "bridge"})
        removed = 0
        for listed in managed:
            name = str(listed.get("Name"))
            if name == keep:
                continue
            with host_lock(f"docker-network-{name}", wait=False) as held:
                if not held:
                    continue
                try:
                    if api.inspect_network(listed["Id"]).get("Containers"):
                        continue
                    api.remove_network(listed["Id"])
                except docker.errors.APIError:
                    continue  # in use after all, or already gone
                self._networks.discard(name)
                removed += 1
        return removed

    def _check_identity(self, attrs: dict[str, Any], spec: WorkloadSpec) -> None:
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        expected = policy.managed_labels(spec.workload_id, spec.tenant, spec.attempt, spec.replica)
        if not policy.identity_matches(labels, expected):
            raise PermanentDriverError(
                f"a container named {spec.name} exists but belongs to another workload", code="name_conflict"
            )

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
            attrs = self._inspect(container, budget)
            if attrs is None:
                return WorkloadStatus(state="missing")
            status = self._status(container, attrs, budget)
            if self.poll_stats and status.state == "running":
                status = self._with_usage(container, status, budget)
        return status

    def _status(self, container: str, attrs: dict[str, Any], budget: Budget) -> WorkloadStatus:
        """Return what `attrs` (inspect's answer) says, with a created container that has output as a lost run."""
        status = status_from(attrs)
        if status.state == "created" and self._has_output(container, budget):
            return WorkloadStatus(state="exited", message=LOST_RUN_NOTE, unobserved=True)
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
        """SIGTERM, SIGKILL after `grace_seconds` (Docker counts whole seconds), and return the final status.

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
            attrs = self._inspect(container, budget)
            if attrs is None:
                return WorkloadStatus(state="missing")
            self._end_lost_task(attrs)
            return self._status(container, attrs, budget)

    def remove(self, handle: Handle, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Kill the container if it runs and delete it with its logs; a missing one is fine."""
        container = container_id(handle)
        budget = Budget(timeout)
        with engine_errors(f"remove {handle.get('name')}"):
            attrs = self._inspect(container, budget)
            if attrs is None:
                return
            self._end_lost_task(attrs)
            try:
                self._api(budget).remove_container(container, force=True)
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as error:
                if error.status_code != 409:  # removal already in progress
                    raise

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
        return self._follow(container, since, follow, Budget(timeout), str(handle.get("name")))

    def _follow(self, container: str, since: str | None, follow: bool, budget: Budget, name: str) -> Iterator[LogLine]:
        with engine_errors(f"logs {name}"):
            while True:
                # Read the state before the logs: an exit seen here means the read below has every line.
                running = follow and self._running(container, budget)
                for line in self._read(container, since, budget):
                    since = line.cursor
                    yield line
                if not running:
                    return
                time.sleep(min(_FOLLOW_INTERVAL, budget.left()))

    def _running(self, container: str, budget: Budget) -> bool:
        attrs = self._api(budget).inspect_container(container)
        return self._status(container, attrs, budget).state in ("created", "running")

    def _read(self, container: str, since: str | None, budget: Budget) -> Iterator[LogLine]:
        # Docker's `since` has whole-second precision here; the filter drops what the cursor already covered.
        seconds = parse_cursor(since)[0] // 1_000_000_000 if since else 0
        api = self._api(budget)
        streams = [
            api.logs(container, out, not out, stream=True, follow=False, timestamps=True, since=seconds or None)
            for out in (True, False)
        ]
        # The SDK turns the socket timeout off on log streams; a watchdog closes them when the budget runs out.
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            _close(streams)

        watchdog = threading.Timer(budget.left(), expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            lines = heapq.merge(_frames(streams[0], "stdout"), _frames(streams[1], "stderr"), key=lambda f: f[0])
            after = CursorFilter(since)
            for ns, stamp, stream, text in lines:
                cursor = after.accept(stamp, ns)
                if cursor is not None:
                    yield LogLine(timestamp=stamp, stream=stream, text=text, cursor=cursor)
        except Exception as error:
            if expired.is_set():
                raise DriverTimeout(f"reading logs took over {budget.timeout:g} s") from error
            raise
        finally:
            watchdog.cancel()
            _close(streams)
        if expired.is_set():
            raise DriverTimeout(f"reading logs took over {budget.timeout:g} s")

    # --- list, info -------------------------------------------------------------

    def list_managed(self, *, timeout: float = DEFAULT_TIMEOUT) -> list[ManagedWorkload]:
        """Return every container labelled gpucloud.managed=1 on this engine, in any state."""
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
            managed.append(ManagedWorkload(name, workload, tenant, attempt, replica, state, handle))
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
        return RuntimeInfo(
            kind=self.kind,
            isolated=True,
            engine_version=version.get("Version"),
            runc_version=components.get("runc") or (info.get("RuncCommit") or {}).get("ID") or None,
            nvidia_runtime="nvidia" in runtimes,
            device_requests=version_tuple(version.get("ApiVersion")) >= (1, 40),
            toolkit_version=toolkit_version(min(5.0, budget.left())) if local else None,
            cpus=info.get("NCPU"),
            memory_mb=int(info["MemTotal"]) // (1024 * 1024) if info.get("MemTotal") else None,
        )
