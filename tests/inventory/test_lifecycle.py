"""The node lifecycle: the transition table, exhaustively, and each operator action from every state."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from inventory import services
from inventory.choices import NODE_TRANSITIONS, NodeState
from inventory.holds import register_gpu_holder, unregister_gpu_holder
from inventory.models import Node, NodeEvent
from tenants.context import Actor
from tenants.models import AuditEvent
from tests.conftest import World, client_for
from tests.inventory.factories import make_node

S = NodeState
# The table, written out independently of inventory.choices.
ALLOWED = {
    (S.REGISTERED, S.PROVISIONING), (S.REGISTERED, S.RETIRED),
    (S.PROVISIONING, S.READY), (S.PROVISIONING, S.FAILED),
    (S.FAILED, S.PROVISIONING), (S.FAILED, S.RETIRED),
    (S.READY, S.CORDONED), (S.CORDONED, S.READY),
    (S.READY, S.DRAINING), (S.CORDONED, S.DRAINING),
    (S.DRAINING, S.MAINTENANCE), (S.DRAINING, S.READY),
    (S.MAINTENANCE, S.READY), (S.MAINTENANCE, S.RETIRED), (S.MAINTENANCE, S.PROVISIONING),
    (S.READY, S.UNREACHABLE), (S.CORDONED, S.UNREACHABLE), (S.DRAINING, S.UNREACHABLE), (S.MAINTENANCE, S.UNREACHABLE),
    (S.UNREACHABLE, S.READY), (S.UNREACHABLE, S.CORDONED), (S.UNREACHABLE, S.DRAINING),
    (S.UNREACHABLE, S.MAINTENANCE), (S.UNREACHABLE, S.RETIRED),
}  # fmt: skip


@pytest.mark.parametrize("source", list(S))
@pytest.mark.parametrize("target", list(S))
def test_transition_table(source: S, target: S) -> None:
    assert NODE_TRANSITIONS.allows(source, target) == ((source, target) in ALLOWED)


def test_retired_is_final_and_every_state_has_a_row() -> None:
    assert set(NODE_TRANSITIONS) == set(S)
    assert NODE_TRANSITIONS[S.RETIRED] == frozenset()


Action = Callable[..., Node]
# action name -> (service, the state it asks for, whether it takes a reason)
ACTIONS: dict[str, tuple[Action, S, bool]] = {
    "provision": (services.provision_node, S.PROVISIONING, False),
    "cordon": (services.cordon_node, S.CORDONED, True),
    "uncordon": (services.uncordon_node, S.READY, False),
    "drain": (services.drain_node, S.DRAINING, True),
    "maintenance": (services.enter_maintenance, S.MAINTENANCE, True),
    "retire": (services.retire_node, S.RETIRED, True),
}
# Where an action ends when it is allowed: draining with nothing held settles into maintenance.
FINAL = {"drain": S.MAINTENANCE}


def _allowed(action: str, source: S) -> bool:
    target = ACTIONS[action][1]
    if action == "maintenance" and source in (S.READY, S.CORDONED):
        return True  # passes through draining
    return (source, target) in ALLOWED


@pytest.mark.parametrize("source", [s for s in S if s != S.UNREACHABLE] + [S.UNREACHABLE])
@pytest.mark.parametrize("action", list(ACTIONS))
def test_each_action_from_each_state(world: World, source: S, action: str) -> None:
    operator = Actor(user=world.operator)
    node = make_node(operator, world.pool, state=source)
    service, target, takes_reason = ACTIONS[action]
    kwargs: dict[str, Any] = {"reason": "because"} if takes_reason else {}
    events, audits = NodeEvent.objects.count(), AuditEvent.all_tenants.count()
    if _allowed(action, source):
        result = service(actor=operator, node=node, **kwargs)
        assert result.state == FINAL.get(action, target)
        assert Node.objects.get(pk=node.pk).state == result.state
        assert NodeEvent.objects.count() > events and AuditEvent.all_tenants.count() > audits
        latest = NodeEvent.objects.filter(node=node).first()
        assert latest is not None and latest.to_state == result.state
    else:
        with pytest.raises(services.IllegalTransition) as raised:
            service(actor=operator, node=node, **kwargs)
        assert raised.value.details["current_state"] == source
        assert Node.objects.get(pk=node.pk).state == source
        assert (NodeEvent.objects.count(), AuditEvent.all_tenants.count()) == (events, audits)


@pytest.mark.parametrize("action", ["cordon", "drain", "maintenance"])
def test_cordon_drain_and_maintenance_need_a_reason(world: World, action: str) -> None:
    operator = Actor(user=world.operator)
    node = make_node(operator, world.pool)
    with pytest.raises(ValidationError) as raised:
        ACTIONS[action][0](actor=operator, node=node, reason="  ")
    assert raised.value.message_dict == {"reason": [f"Say why the node becomes {ACTIONS[action][1]}."]}
    assert Node.objects.get(pk=node.pk).state == S.READY


def test_tenant_admins_cannot_act_on_nodes(world: World) -> None:
    node = make_node(Actor(user=world.operator), world.pool)
    with pytest.raises(Exception, match="Only operators"):
        services.cordon_node(actor=Actor(user=world.admin_a), node=node, reason="mine now")


def test_illegal_transition_answers_409_with_the_current_state(world: World) -> None:
    make_node(Actor(user=world.operator), world.pool, state=S.REGISTERED)
    response = client_for(world.operator).post("/api/v1/nodes/n1/uncordon/", {}, format="json")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "illegal_transition"
    assert error["details"] == {"current_state": "registered", "requested_state": "ready"}


def test_missing_reason_answers_400_naming_the_field(world: World) -> None:
    make_node(Actor(user=world.operator), world.pool)
    response = client_for(world.operator).post("/api/v1/nodes/n1/cordon/", {}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["reason"][0]["code"] == "required"


@pytest.fixture
def holds() -> Iterator[dict[int, int]]:
    """Stand in for allocations: {node id: holds}, as the jobs app will report them."""
    counts: dict[int, int] = {}
    register_gpu_holder("test", lambda node_ids: {n: counts[n] for n in node_ids if n in counts})
    yield counts
    unregister_gpu_holder("test")


def test_draining_waits_for_holds_then_reaches_maintenance(world: World, holds: dict[int, int]) -> None:
    operator = Actor(user=world.operator)
    node = make_node(operator, world.pool, gpus=2)
    holds[node.pk] = 1
    assert services.drain_node(actor=operator, node=node, reason="kernel update").state == S.DRAINING
    assert services.settle_draining_nodes() == 0
    with pytest.raises(services.IllegalTransition):
        services.retire_node(actor=operator, node=node)
    holds[node.pk] = 0
    assert services.settle_draining_nodes() == 1
    node.refresh_from_db()
    assert (node.state, node.state_reason) == (S.MAINTENANCE, "kernel update")
    assert services.settle_draining_nodes() == 0  # idempotent


def test_maintenance_is_refused_while_gpus_are_held(world: World, holds: dict[int, int]) -> None:
    operator = Actor(user=world.operator)
    node = make_node(operator, world.pool, gpus=1)
    holds[node.pk] = 2
    response = client_for(world.operator).post("/api/v1/nodes/n1/maintenance/", {"reason": "swap"}, format="json")
    assert response.status_code == 409
    assert response.json()["error"]["details"] == {"current_state": "ready", "active_holds": 2}
    assert Node.objects.get(pk=node.pk).state == S.READY
