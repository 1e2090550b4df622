"""The tenants' bridge networks of the Docker runtime: made on first use, shared by racing creators, pruned when idle.

Every container joins its tenant's own bridge (`policy.tenant_network_name`),
whose interface is named for the agent's egress rules (`egress.bridge_name`).
`TenantNetworks` remembers which bridges it has seen exist, makes a missing
one under a host-wide lock, and frees the engine's address pools by
removing bridges no container is attached to. Used by `_runtime`
and `_containers`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import suppress

import docker
import docker.errors

from inventory.drivers import egress, policy
from inventory.drivers.docker._engine import Budget, host_lock, networks_named

BRIDGE_NAME_OPTION = "com.docker.network.bridge.name"


def network_missing(error: docker.errors.APIError, network: str) -> bool:
    """Whether the engine refused a container because its network `network` does not exist.

    Engines before API 1.44 accept the container and refuse at its start; later ones refuse the creation.
    """
    text = str(error.explanation or error)
    return "network" in text and network in text


def _pools_exhausted(error: docker.errors.APIError) -> bool:
    """Whether the engine refused a network because no address pool has a free subnet left."""
    return "available, non-overlapping" in str(error.explanation or error)


class TenantNetworks:
    """The tenant bridges of one runtime; `api` returns the thread's client with its timeout set to a budget's rest."""

    def __init__(self, api: Callable[[Budget], docker.APIClient]) -> None:
        self._api = api
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def forget(self, network: str) -> None:
        """Stop taking `network` for granted: the next `ensure` asks the engine again (it was found removed)."""
        self._known.discard(network)

    def ensure(self, network: str, tenant: str, budget: Budget) -> None:
        """Create the tenant's bridge unless it exists; concurrent creators end up sharing one.

        Engines before API 1.44 check duplicate names only best-effort, so
        racing creators can each make one: all of them then keep the oldest
        and remove the others (which nothing can have joined yet).
        """
        if network in self._known:
            return
        with self._lock, host_lock(f"docker-network-{network}"):
            api = self._api(budget)
            if not networks_named(api, network):
                labels = {policy.LABEL_MANAGED: policy.MANAGED, policy.LABEL_TENANT: tenant}
                try:
                    self._create(api, network, labels, budget)
                except docker.errors.APIError as error:
                    # A racing creator's bridge took the name (409) or the interface name: theirs is shared.
                    if error.status_code != 409 and not networks_named(api, network):
                        raise
                for extra in networks_named(api, network)[1:]:
                    if (extra.get("Labels") or {}).get(policy.LABEL_MANAGED) == policy.MANAGED:
                        with suppress(docker.errors.APIError):
                            api.remove_network(extra["Id"])
            self._known.add(network)

    def _create(self, api: docker.APIClient, network: str, labels: dict[str, str], budget: Budget) -> None:
        """Create a bridge; when the engine's address pools are used up, prune idle tenant bridges and try once more.

        Each bridge takes a subnet from the engine's pools (31 with Docker's
        defaults), so a host that served more tenants than that over its life
        would refuse every new one while bridges of tenants with nothing
        running hold the subnets.
        """
        # A bridge interface named by `egress.bridge_name`: the agent's egress rules match every workload bridge.
        options = {BRIDGE_NAME_OPTION: egress.bridge_name(network)}
        try:
            api.create_network(network, driver="bridge", labels=labels, options=options, check_duplicate=True)
        except docker.errors.APIError as error:
            if not _pools_exhausted(error) or not self.prune_idle(budget, keep=network):
                raise
            api.create_network(network, driver="bridge", labels=labels, options=options, check_duplicate=True)

    def prune_idle(self, budget: Budget, *, keep: str) -> int:
        """Remove this product's bridges that no container is attached to (except `keep`); return how many.

        Each is checked and removed under its creation lock, so no creator on
        this host is between making it and attaching to it; one whose lock is
        busy is skipped (waiting could deadlock with a creator pruning the
        other way round). A container created after the removal finds its
        network gone and makes it again (`DockerRuntime.start`).
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
                self._known.discard(name)
                removed += 1
        return removed
