"""Gang networks where a real engine cannot produce the condition: failures injected at the Docker API boundary.

The rest runs on real engines (tests/inventory/test_gang_multihost.py).
Here: two managers racing to make one gang's network, where the loser is
told it already exists, and the network it then finds is checked as if it
had found it first.
"""

from __future__ import annotations

from typing import Any

import docker.errors
import pytest

from inventory.drivers import policy
from inventory.drivers.base import PermanentDriverError, WorkloadSpec
from inventory.drivers.docker._engine import Budget
from inventory.drivers.docker._gangs import GangNetworks, swarm_of
from tests.inventory.drivers.conftest import TEST_INSTALLATION

SPEC = WorkloadSpec(
    name=policy.container_name(TEST_INSTALLATION, "7", 0, 0),
    workload_id="7",
    tenant="acme",
    attempt=0,
    image="x",
    gang_across_hosts=True,
    installation=TEST_INSTALLATION,
)


class LosingManager:
    """A manager's API whose network list is empty, whose create is refused as a duplicate, and whose inspect
    shows the network the winner made with `labels`."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.created: list[str] = []

    def info(self) -> dict[str, Any]:
        return {"Swarm": {"LocalNodeState": "active", "ControlAvailable": True}}

    def networks(self, **_: Any) -> list[dict[str, Any]]:
        return []

    def create_network(self, name: str, **_: Any) -> None:
        self.created.append(name)
        raise docker.errors.APIError("409", explanation=f"network with name {name} already exists")

    def inspect_network(self, name: str) -> dict[str, Any]:
        return {"Name": name, "Labels": self.labels}


def _gang_labels(tenant: str) -> dict[str, str]:
    return {
        policy.LABEL_MANAGED: policy.MANAGED,
        policy.LABEL_PURPOSE: policy.GANG_PURPOSE,
        policy.LABEL_TENANT: tenant,
        policy.LABEL_WORKLOAD: "7",
        policy.LABEL_ATTEMPT: "0",
    }


def test_a_manager_that_loses_the_race_to_make_its_gangs_network_shares_the_winners() -> None:
    api = LosingManager(_gang_labels("acme"))
    network = policy.gang_network_name(TEST_INSTALLATION, "7", 0)
    assert GangNetworks(lambda _: api).ensure(SPEC, Budget(5)) == network  # type: ignore[arg-type,return-value]  # a fake API
    assert api.created == [network]


def test_a_manager_that_loses_the_race_to_another_tenants_network_of_that_name_refuses_it() -> None:
    api = LosingManager(_gang_labels("someone-else"))
    with pytest.raises(PermanentDriverError) as refused:
        GangNetworks(lambda _: api).ensure(SPEC, Budget(5))  # type: ignore[arg-type,return-value]  # a fake API
    assert refused.value.code == "name_conflict"


@pytest.mark.parametrize(
    ("swarm", "found"),
    [
        ({"LocalNodeState": "inactive"}, ("", "")),
        ({"LocalNodeState": "pending", "ControlAvailable": True}, ("", "")),  # joining: not in it yet
        (  # a worker knows its managers, not the cluster's ID
            {"LocalNodeState": "active", "NodeID": "w1", "RemoteManagers": [{"NodeID": "m2"}, {"NodeID": "m1"}]},
            ("m1", "worker"),
        ),
        (  # a manager: the same key, whichever manager it is
            {
                "LocalNodeState": "active",
                "NodeID": "m2",
                "ControlAvailable": True,
                "RemoteManagers": [{"NodeID": "m1"}],
            },
            ("m1", "manager"),
        ),
    ],
)
def test_the_swarm_key_is_the_same_on_every_member(swarm: dict[str, Any], found: tuple[str, str]) -> None:
    assert swarm_of({"Swarm": swarm}) == found
