"""A replica's container on the Docker engine: adopt or create and start it, and deal with runs the engine lost.

`Containers` is what `DockerRuntime` delegates its container work to:
`create_and_start` (with the lost-start handling its docstring explains),
`inspect`, `status` (which reports a lost run) and `end_lost_task` (which
stop and remove need before the engine can act).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Protocol

import docker
import docker.errors

from inventory.drivers import policy
from inventory.drivers.base import (
    PermanentDriverError,
    PullListener,
    RunAs,
    TransientDriverError,
    WorkloadSpec,
    WorkloadStatus,
)
from inventory.drivers.docker._config import container_config
from inventory.drivers.docker._engine import Budget, kill_container_processes, status_from
from inventory.drivers.docker._networks import TenantNetworks
from inventory.drivers.docker._pull import pull_image
from inventory.drivers.storage import prepare_mounts

LOST_RUN_NOTE = (
    "It ran while the node's container engine restarted, and the engine lost track of it:"
    " its output is kept, but how it ended is not known."
)


class ContainerSettings(Protocol):
    """The runtime settings `Containers` reads, at each call (they are `DockerRuntime`'s public attributes)."""

    base_url: str
    user: str
    publish_address: str
    pull_images: bool
    log_max_size: str


def numeric_user(user: str) -> RunAs | None:
    """Return the uid and gid of a `uid:gid` user setting, or None when it names a user (no owner to give)."""
    uid, _, gid = user.partition(":")
    return RunAs(int(uid), int(gid or uid)) if uid.isdigit() and (gid or uid).isdigit() else None


def _stale_task(error: docker.errors.APIError) -> bool:
    """Whether a start failed because containerd still has a task of the container (an interrupted start).

    Docker 20.10 says "task ... already exists" or "id already in use",
    depending on how far the interrupted start had gone.
    """
    text = str(error.explanation or error)
    return ("task" in text and "already exists" in text) or "id already in use" in text


class Containers:
    """The containers of one runtime; `api` returns the thread's client with its timeout set to a budget's rest."""

    def __init__(
        self, settings: ContainerSettings, api: Callable[[Budget], docker.APIClient], networks: TenantNetworks
    ) -> None:
        self._settings = settings
        self._api = api
        self._networks = networks

    # --- start ----------------------------------------------------------------

    def create_and_start(
        self, spec: WorkloadSpec, network: str, budget: Budget, on_pull: PullListener | None = None
    ) -> dict[str, Any]:
        """Adopt or create the container of `spec` and start it unless it already ran; return its attributes.

        Creating it pulls its image first when the engine lacks it (and
        pulling is on), telling `on_pull` how the pull goes (`pull_image`).

        An engine that dies in the middle of a start can leave containerd
        running the container while the engine, restarted, still lists it as
        created (it never recorded the start). Such a run is never started a
        second time beside or after itself: a created container found with
        output already ran (`_lost_run`), and one whose start the engine
        refuses because containerd still has its task is ended first
        (`_after_lost_start`).
        """
        found = self.inspect(spec.name, budget)
        adopted = found is not None
        if found is None:
            found = self._create(spec, network, budget, on_pull)
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
            found = self.inspect(str(found["Id"]), budget) or found
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
        attrs = self.inspect(container, budget)
        if attrs is not None and self._has_output(container, budget):
            return attrs, False  # a lost run, ended above: poll reports it
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

    def end_lost_task(self, attrs: dict[str, Any]) -> None:
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
        return kill_container_processes(container) if self._settings.base_url.startswith("unix://") else None

    def _discard(self, container: str) -> None:
        """Remove a container that did not start, so that a retry starts afresh (a failure is left to reconcile)."""
        with suppress(Exception):
            self._api(Budget(10.0)).remove_container(container, force=True)

    # --- create -----------------------------------------------------------------

    def _create(
        self, spec: WorkloadSpec, network: str, budget: Budget, on_pull: PullListener | None = None
    ) -> dict[str, Any]:
        """Create the container; on a name conflict (a concurrent start) return the winner's attributes.

        Its volume directories are prepared first (made when missing, owned
        by the mount's owner, else by the user it runs as), and bound by
        their real path.
        """
        if not spec.gang_across_hosts:  # a gang's overlay is made by `_gangs` before
            self._networks.ensure(network, spec.tenant, budget)
        settings = self._settings
        mounts = prepare_mounts(spec.mounts, spec.run_as or numeric_user(settings.user))
        config = container_config(
            dataclasses.replace(spec, mounts=mounts),
            user=settings.user,
            network=network,
            log_max_size=settings.log_max_size,
            publish_address=settings.publish_address,
        )
        try:
            created = self._create_pulling(config, budget, on_pull)
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
            found = self.inspect(name, budget)
            if found is not None or time.monotonic() >= deadline:
                return found
            time.sleep(0.05)

    def _create_pulling(self, config: dict[str, Any], budget: Budget, on_pull: PullListener | None) -> dict[str, Any]:
        """Create the container from `config`; pull its image first if the engine lacks it and pulling is on."""
        try:
            created: dict[str, Any] = self._api(budget).create_container(**config)
        except docker.errors.ImageNotFound as error:
            if not self._settings.pull_images:
                raise PermanentDriverError(
                    f"image {config['image']} is not on this node and pulling is off", code="image_not_found"
                ) from error
            pull_image(self._api(budget), config["image"], budget, on_pull)
            created = self._api(budget).create_container(**config)
        return created

    def _check_identity(self, attrs: dict[str, Any], spec: WorkloadSpec) -> None:
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        owner = {"installation": spec.installation, "node": spec.node}
        expected = policy.managed_labels(spec.workload_id, spec.tenant, spec.attempt, spec.replica, **owner)
        if not policy.identity_matches(labels, expected):
            raise PermanentDriverError(
                f"a container named {spec.name} exists but belongs to another workload", code="name_conflict"
            )

    # --- read -------------------------------------------------------------------

    def inspect(self, name: str, budget: Budget) -> dict[str, Any] | None:
        """Return `inspect_container`'s answer for container `name` (a name or an id), or None when it is gone."""
        try:
            attrs: dict[str, Any] = self._api(budget).inspect_container(name)
        except docker.errors.NotFound:
            return None
        return attrs

    def status(self, container: str, attrs: dict[str, Any], budget: Budget) -> WorkloadStatus:
        """Return what `attrs` (inspect's answer) says, with a created container that has output as a lost run."""
        status = status_from(attrs)
        if status.state == "created" and self._has_output(container, budget):
            return WorkloadStatus(state="exited", message=LOST_RUN_NOTE, unobserved=True)
        return status

    def _has_output(self, container: str, budget: Budget) -> bool:
        try:
            tail = self._api(budget).logs(container, stdout=True, stderr=True, tail=1)
        except docker.errors.NotFound:
            return False
        return bool(tail)
