"""A node may point the notebook proxy only at itself: its registered address and a port the engine publishes."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from rest_framework.test import APIClient

from common.protocol.messages import ReplicaStarted
from inventory.choices import NodeState
from inventory.models import Node
from inventory.services.local_node import LOCAL_LABEL
from jobs.models import Replica
from jobs.services import agent_gateway
from jobs.services.endpoints import endpoint_problem
from jobs.services.replicas import record_replica_started
from tests.conftest import World, actor, client_for
from tests.inventory.factories import make_node
from tests.jobs.factories import add_replica

pytestmark = pytest.mark.django_db

ADDRESS = "10.20.30.40"
GOOD = f"http://{ADDRESS}:32768"
FORGED = [
    "http://127.0.0.1:5432",  # the console's own database, on the console's loopback
    "http://[::1]:6379",
    "http://169.254.169.254:80",
    "http://10.20.30.41:32768",  # another host
    "http://db.internal:5432",
    f"http://{ADDRESS}:22",  # the node's own, but no port the engine publishes
    f"http://{ADDRESS}:0",
    f"https://{ADDRESS}:32768",
    f"http://user@{ADDRESS}:32768",
    f"http://{ADDRESS}:32768/elsewhere",
    f"http://{ADDRESS}",
    "not a url",
]


def _node(world: World, name: str, *, address: str = ADDRESS, labels: dict[str, str] | None = None) -> Node:
    operator = actor(world.operator)
    return make_node(operator, world.pool, name=name, runtime="docker", address=address, labels=labels or {})


def _join(world: World, node: Node) -> APIClient:
    """Join `node`'s agent through the gateway as a real host would; return a client speaking with its credential."""
    issued = client_for(world.operator).post(f"/api/v1/nodes/{node.name}/join-token/", {}, format="json")
    joined = APIClient().post("/api/v1/agent/join", {"token": issued.json()["token"], "hostname": "h"}, format="json")
    assert joined.status_code == 201, joined.content
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {joined.json()['credential']}")
    return client


def _started(replica: Replica, endpoint: str, *, in_handle: bool = False) -> dict[str, Any]:
    handle: dict[str, Any] = {"id": "c1", "endpoint": endpoint} if in_handle else {"id": "c1"}
    kwargs = {"workload_id": replica.workload_id, "attempt": 1, "replica": 0, "handle": handle}
    if not in_handle:
        kwargs["endpoint"] = endpoint
    return {"kind": "task", "task": ReplicaStarted.TASK, "kwargs": kwargs}


@pytest.mark.parametrize("endpoint", FORGED)
@pytest.mark.parametrize("in_handle", [False, True], ids=["argument", "handle"])
def test_a_forged_endpoint_is_refused_at_the_gateway_and_nothing_is_delivered(
    world: World, endpoint: str, in_handle: bool, caplog: Any
) -> None:
    node = _node(world, "gpu-1")
    agent = _join(world, node)
    replica = add_replica(world, node, name="nb")
    with caplog.at_level(logging.WARNING, logger="jobs.services.agent_gateway"):
        answer = agent.post(
            "/api/v1/agent/reports", {"messages": [_started(replica, endpoint, in_handle=in_handle)]}, format="json"
        )
    assert answer.status_code == 403, answer.content
    assert answer.json()["error"]["rejected"][0]["reason"].startswith("endpoint refused")
    assert "gpu-1 reported an endpoint the proxy may not use" in caplog.text
    replica.refresh_from_db()
    assert (replica.endpoint, replica.handle, replica.state) == ("", {}, "launching")


def test_the_nodes_own_address_and_a_published_port_pass_the_gateway(world: World) -> None:
    node = _node(world, "gpu-1")
    replica = add_replica(world, node, name="nb")
    assert agent_gateway.check_messages(node, [_started(replica, GOOD)]) == []
    assert agent_gateway.check_messages(node, [_started(replica, GOOD, in_handle=True)]) == []
    assert agent_gateway.check_messages(node, [_started(replica, "")]) == []  # no service port


def test_a_joined_node_labelled_local_still_may_not_point_at_loopback(world: World) -> None:
    node = _node(world, "gpu-1", address="127.0.0.1", labels={LOCAL_LABEL: "true"})
    agent = _join(world, node)
    replica = add_replica(world, node, name="nb")
    answer = agent.post(
        "/api/v1/agent/reports", {"messages": [_started(replica, "http://127.0.0.1:5432")]}, format="json"
    )
    assert answer.status_code == 403, answer.content


def test_the_service_keeps_a_start_but_drops_an_endpoint_off_the_node(world: World, caplog: Any) -> None:
    node = _node(world, "gpu-1")
    replica = add_replica(world, node, name="nb")
    with caplog.at_level(logging.WARNING, logger="jobs.services.replicas"):
        record_replica_started(
            workload_id=replica.workload_id, attempt=1, replica=0, handle={"id": "c1"}, endpoint="http://127.0.0.1:5432"
        )
    replica.refresh_from_db()
    assert (replica.state, replica.endpoint) == ("running", "")
    assert "refused: 127.0.0.1 is a loopback, link-local or metadata address" in caplog.text
    other = add_replica(world, node, name="nb2")
    record_replica_started(workload_id=other.workload_id, attempt=1, replica=0, handle={"id": "c2"}, endpoint=GOOD)
    other.refresh_from_db()
    assert other.endpoint == GOOD


def test_the_consoles_local_node_may_report_loopback(world: World) -> None:
    local = _node(world, "local", address="127.0.0.1", labels={LOCAL_LABEL: "true"})
    replica = add_replica(world, local, name="nb")
    record_replica_started(
        workload_id=replica.workload_id, attempt=1, replica=0, handle={"id": "c1"}, endpoint="http://127.0.0.1:40001"
    )
    replica.refresh_from_db()
    assert replica.endpoint == "http://127.0.0.1:40001"


def test_a_node_without_a_registered_address_may_report_no_endpoint(world: World) -> None:
    node = make_node(actor(world.operator), world.pool, name="bare", runtime="docker", state=NodeState.READY)
    assert endpoint_problem(GOOD, node, local=False) == f"{ADDRESS} is not node bare's registered address (none)"
