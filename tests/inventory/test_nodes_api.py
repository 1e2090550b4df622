"""The node API: registration rules, what operators see, what tenants see of pools (capacity, never nodes)."""

from __future__ import annotations

import pytest

from inventory.choices import GpuHealth, NodeState
from inventory.models import Gpu, Node, NodePool
from tenants.context import Actor
from tenants.models import AuditEvent
from tests.conftest import World, client_for
from tests.inventory.factories import make_node


def test_operator_registers_a_node_and_it_is_audited(world: World) -> None:
    body = {"name": "gpu-01.rack-a", "pool": "shared", "kind": "bare_metal", "runtime": "docker",
            "labels": {"rack": "a"}, "address": "10.0.0.11"}  # fmt: skip
    response = client_for(world.operator).post("/api/v1/nodes/", body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["state"], data["agent_queue"], data["isolated"], data["simulated"]) == (
        "registered", "node.gpu-01.rack-a", True, False
    )  # fmt: skip
    assert AuditEvent.all_tenants.filter(action="node.register", object_repr="gpu-01.rack-a").exists()


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ({"name": "Bad_Name"}, "name", "invalid_node_name"),
        ({"pool": "nope"}, "pool", "does_not_exist"),
        ({"runtime": "kubernetes"}, "runtime", "invalid_choice"),
        ({"simulated_gpu_count": 4}, "simulated_gpu_count", "simulated_only"),
        ({"runtime": "simulated", "simulated_gpu_count": 65}, "simulated_gpu_count", "max_value"),
        ({"cpu_cores": -1}, "cpu_cores", "min_value"),
        ({"labels": {"k": ["x"]}}, "labels.k", "invalid"),
        ({"labels": {"k" * 64: "v"}}, "labels", "invalid"),
    ],
)
def test_bad_registrations_name_the_field_and_write_nothing(world: World, body: dict, field: str, code: str) -> None:
    payload = {"name": "n1", "pool": "shared", **body}
    response = client_for(world.operator).post("/api/v1/nodes/", payload, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["fields"][field][0]["code"] == code
    assert not Node.objects.exists()
    assert not AuditEvent.all_tenants.filter(action="node.register").exists()


def test_duplicate_name_is_refused(world: World) -> None:
    make_node(Actor(user=world.operator), world.pool)
    response = client_for(world.operator).post("/api/v1/nodes/", {"name": "n1", "pool": "shared"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["name"][0]["code"] == "unique"


def test_process_runtime_is_flagged_not_isolated(world: World) -> None:
    make_node(Actor(user=world.operator), world.pool, runtime="process")
    data = client_for(world.operator).get("/api/v1/nodes/n1/").json()
    assert (data["runtime"], data["isolated"]) == ("process", False)


def test_moving_a_ready_node_to_another_pool_is_refused(world: World) -> None:
    make_node(Actor(user=world.operator), world.pool)
    NodePool.objects.create(name="other")
    response = client_for(world.operator).patch("/api/v1/nodes/n1/", {"pool": "other"}, format="json")
    assert response.status_code == 409
    assert response.json()["error"]["details"] == {"current_state": "ready"}


def test_operator_reads_gpus_and_events(world: World) -> None:
    make_node(Actor(user=world.operator), world.pool, gpus=2)
    Gpu.objects.filter(index=1).update(health=GpuHealth.FAILED, health_reason="XID 79")
    operator = client_for(world.operator)
    gpus = operator.get("/api/v1/nodes/n1/gpus/").json()
    assert [(g["index"], g["health"]) for g in gpus] == [(0, "ok"), (1, "failed")]
    failed = operator.get("/api/v1/gpus/?health=failed").json()["results"]
    assert [g["uuid"] for g in failed] == ["GPU-n1-1"]
    events = operator.get("/api/v1/nodes/n1/events/").json()["results"]
    assert [e["to_state"] for e in events[:2]] == ["ready", "provisioning"]
    assert operator.get("/api/v1/nodes/nope/gpus/").status_code == 404


def test_tenants_see_capacity_of_their_pools_never_nodes(world: World) -> None:
    operator = Actor(user=world.operator)
    make_node(operator, world.pool, gpus=4)
    make_node(operator, world.pool, name="n2", gpus=2, state=NodeState.CORDONED)
    make_node(operator, world.pool, name="n3", gpus=8, state=NodeState.MAINTENANCE)
    Gpu.objects.filter(uuid="GPU-n1-3").update(health=GpuHealth.FAILED)
    secret = NodePool.objects.create(name="secret", dedicated_tenant=world.tenant_b)
    make_node(operator, secret, name="b1", gpus=8)
    member = client_for(world.member_a)
    pools = member.get("/api/v1/node-pools/").json()["results"]
    assert [p["name"] for p in pools] == ["shared"]
    # In service: 4 on n1 (1 failed) + 2 on cordoned n2; free: the 3 healthy GPUs of ready n1.
    assert pools[0]["capacity"] == [{"model": "NVIDIA H100 80GB HBM3", "total": 6, "free": 3}]
    assert member.get("/api/v1/node-pools/secret/").status_code == 404
    for url in ("/api/v1/nodes/", "/api/v1/nodes/n1/", "/api/v1/gpus/", "/api/v1/nodes/n1/gpus/"):
        assert member.get(url).status_code == 403, url
    assert client_for(world.admin_b).get("/api/v1/node-pools/secret/").json()["capacity"][0]["total"] == 8


def test_every_failing_field_of_a_registration_is_named_at_once(world: World) -> None:
    make_node(Actor(user=world.operator), world.pool)
    operator = client_for(world.operator)
    service_rules = {"name": "n1", "pool": "shared", "simulated_gpu_count": 4, "labels": {"k" * 64: "v"}}
    response = operator.post("/api/v1/nodes/", service_rules, format="json")
    assert response.status_code == 400, response.content
    codes = {field: errors[0]["code"] for field, errors in response.json()["error"]["fields"].items()}
    assert codes == {"name": "unique", "simulated_gpu_count": "simulated_only", "labels": "invalid"}
    # The serializer's refusals and the service's rules of the fields it accepted, in one answer.
    mixed = {"name": "Bad_Name", "pool": "nope", "cpu_cores": -1, "simulated_gpu_count": 2}
    response = operator.post("/api/v1/nodes/", mixed, format="json")
    codes = {field: errors[0]["code"] for field, errors in response.json()["error"]["fields"].items()}
    assert codes == {
        "name": "invalid_node_name",
        "pool": "does_not_exist",
        "cpu_cores": "min_value",
        "simulated_gpu_count": "simulated_only",
    }
    assert Node.objects.count() == 1
    assert AuditEvent.all_tenants.filter(action="node.register").count() == 1
