"""The networks of gangs spread over hosts: one attachable swarm overlay per gang attempt, removed when idle.

Containers of a tenant on one host share the tenant's bridge
(`_networks`), which does not reach past the host. The replicas of a
gang placed on several hosts instead share an overlay network of their own
(`policy.gang_network_name`): the GPU hosts' engines form a Docker swarm
(docs/gangs.md), the overlay's VXLAN carries the gang's traffic between
them, and its DNS resolves each replica's container name. Nothing else
joins it, not even the tenant's other workloads.

Only a swarm manager can make a swarm network: the replica of the gang on a
manager makes it (the swarm keeps network names unique, so managers racing
to make it share one); a replica on a worker attaches to it by name once it
exists (`DockerRuntime.start` waits for it). An engine outside a swarm
refuses such a replica at once (`no_swarm`). A manager removes the network
when the gang's containers stop or go, and prunes gang networks left idle
(the swarm refuses to remove one any container still uses, on any host).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Literal

import docker
import docker.errors

from inventory.drivers import policy
from inventory.drivers.base import PermanentDriverError, WorkloadSpec
from inventory.drivers.docker._engine import Budget, networks_named
from inventory.drivers.timestamps import parse_ns

SwarmRole = Literal["manager", "worker", ""]

# A gang network younger than this is never pruned: its replicas may not have attached yet.
IDLE_GRACE_SECONDS = 600.0


def attach_refused(error: docker.errors.APIError, network: str) -> bool:
    """Whether the engine refused a container because gang network `network` does not exist (yet) in the swarm.

    A worker learns of a swarm network only when a container attaches to it:
    with API 1.41 the container is created and its start is refused.
    """
    text = str(error.explanation or error)
    return network in text and "not found" in text


def swarm_of(info: dict[str, Any]) -> tuple[str, SwarmRole]:
    """Return (the swarm's key, this engine's role) from `docker info`, or ("", "") for an engine in no swarm.

    The key is the smallest node ID among the swarm's managers: the same on
    every member, managers and workers alike (a worker's `info` names the
    managers it knows but not the cluster's ID). It changes only when that
    manager leaves the swarm or is demoted; the nodes probed after that then
    report the new key.
    """
    swarm = info.get("Swarm") or {}
    if swarm.get("LocalNodeState") != "active":
        return "", ""
    managers = [str(m.get("NodeID") or "") for m in swarm.get("RemoteManagers") or () if m.get("NodeID")]
    role: SwarmRole = "manager" if swarm.get("ControlAvailable") else "worker"
    if role == "manager" and swarm.get("NodeID"):
        managers.append(str(swarm["NodeID"]))
    return (min(managers) if managers else ""), role


class GangNetworks:
    """The gang overlays one engine takes part in; `api` returns the thread's client with a budget's timeout.

    `encrypted` makes new overlays with `--opt encrypted` (IPsec between
    hosts; the hosts' kernels need XFRM and ESP must pass between them:
    docs/gangs.md).
    """

    def __init__(self, api: Callable[[Budget], docker.APIClient], *, encrypted: bool = False) -> None:
        self._api = api
        self.encrypted = encrypted

    def role(self, budget: Budget) -> SwarmRole:
        """Return this engine's part in a swarm: `manager`, `worker`, or "" when it is in none."""
        return swarm_of(self._api(budget).info())[1]

    def ensure(self, spec: WorkloadSpec, budget: Budget) -> str:
        """Return the name of the gang network of `spec`, made here when this engine is a manager and it is missing.

        A manager also prunes idle gang networks (best effort). Raises
        PermanentDriverError `no_swarm` when the engine is in no swarm (the
        replica could never reach the rest of its gang), `name_conflict`
        when a network of that name exists but is not this gang's.
        """
        network = policy.gang_network_name(spec.installation, spec.workload_id, spec.attempt)
        role = self.role(budget)
        if not role:
            raise PermanentDriverError(
                f"{spec.name} belongs to a gang spread over several hosts, but this node's Docker engine is in no"
                " swarm: its replicas could not reach each other (docs/gangs.md says how GPU hosts join one)",
                code="no_swarm",
            )
        if role == "manager":
            with suppress(docker.errors.APIError):
                self.prune_idle(budget)
            self._create(network, spec, budget)
        return network

    def check_owner(self, network: str, spec: WorkloadSpec, budget: Budget) -> None:
        """Raise PermanentDriverError `name_conflict` unless gang network `network` is labelled as the gang of `spec`.

        A worker sees a swarm network only once a container is attached to
        it, so this runs after the start too. A network that is gone is left
        alone: nothing can be on it.
        """
        try:
            labels = self._api(budget).inspect_network(network).get("Labels") or {}
        except docker.errors.NotFound:
            return
        if not policy.identity_matches(labels, _labels(spec)):
            raise PermanentDriverError(
                f"a network named {network} exists but is not the gang network of {spec.name}", code="name_conflict"
            )

    def _create(self, network: str, spec: WorkloadSpec, budget: Budget) -> None:
        api = self._api(budget)
        if networks_named(api, network):
            self.check_owner(network, spec, budget)
            return
        try:
            api.create_network(
                network,
                driver="overlay",
                attachable=True,
                labels=_labels(spec),
                options={"encrypted": "true"} if self.encrypted else None,
                check_duplicate=True,
            )
        except docker.errors.APIError as error:
            # Another manager (a replica of the same gang) made it first.
            if error.status_code != 409 and "already exists" not in str(error.explanation or error):
                raise
            self.check_owner(network, spec, budget)

    def release(self, network: str, budget: Budget) -> None:
        """Remove gang network `network` if no container uses it any more, then prune idle ones; a worker does nothing.

        Best effort: the swarm refuses a network still in use anywhere, and
        any error leaves the network to a later release or prune.
        """
        with suppress(docker.errors.APIError, PermanentDriverError):
            if self.role(budget) != "manager":
                return
            api = self._api(budget)
            for found in networks_named(api, network):
                with suppress(docker.errors.APIError):
                    api.remove_network(found["Id"])
            self.prune_idle(budget)

    def prune_idle(self, budget: Budget, *, now: float | None = None) -> int:
        """Remove this product's gang networks older than IDLE_GRACE_SECONDS that no container uses; return how many.

        Only overlays labelled both managed and gang: an operator's own
        swarm networks are never touched, whatever else they are labelled.
        """
        api = self._api(budget)
        labels = [f"{policy.LABEL_MANAGED}={policy.MANAGED}", f"{policy.LABEL_PURPOSE}={policy.GANG_PURPOSE}"]
        cutoff = ((time.time() if now is None else now) - IDLE_GRACE_SECONDS) * 1e9
        removed = 0
        for listed in api.networks(filters={"label": labels, "driver": "overlay"}):
            try:
                if parse_ns(str(listed.get("Created"))) > cutoff:
                    continue
                api.remove_network(listed["Id"])
            except (ValueError, docker.errors.APIError):
                continue  # in use on some host, or already gone
            removed += 1
        return removed


def _labels(spec: WorkloadSpec) -> dict[str, str]:
    """Return the labels of the gang network of `spec`: managed, purpose gang, its tenant, workload and attempt."""
    return {
        policy.LABEL_MANAGED: policy.MANAGED,
        policy.LABEL_PURPOSE: policy.GANG_PURPOSE,
        policy.LABEL_TENANT: spec.tenant,
        policy.LABEL_WORKLOAD: spec.workload_id,
        policy.LABEL_ATTEMPT: str(spec.attempt),
    }
