"""Every state machine: one helper, a consistent table, forbidden moves refused, and no state written around it."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from django.db import models

from accounting.choices import REQUEST_TRANSITIONS, RequestState
from accounting.models import IncreaseRequest
from common.transitions import ForbiddenTransition, Transitions
from inventory.choices import NODE_TRANSITIONS, NodeState
from inventory.models import Node
from jobs.choices import WORKLOAD_TRANSITIONS, WorkloadState
from jobs.models import Workload
from notifications.choices import DELIVERY_TRANSITIONS, DeliveryState
from notifications.models import Delivery
from tenants.choices import INVITATION_TRANSITIONS, InvitationState
from tenants.models import Invitation

ROOT = Path(__file__).resolve().parents[2]

# machine, its model, the states it ends in for good (written out here, not read from the table), and one move
# it forbids.
MACHINES: list[tuple[Transitions[Any], type[models.Model], set[str], tuple[str, str]]] = [
    (WORKLOAD_TRANSITIONS, Workload, set(), (WorkloadState.PENDING, WorkloadState.RUNNING)),
    (NODE_TRANSITIONS, Node, {NodeState.RETIRED}, (NodeState.RETIRED, NodeState.READY)),
    (
        DELIVERY_TRANSITIONS,
        Delivery,
        {DeliveryState.SUCCEEDED, DeliveryState.FAILED},
        (DeliveryState.SUCCEEDED, DeliveryState.SENDING),
    ),
    (
        REQUEST_TRANSITIONS,
        IncreaseRequest,
        {RequestState.REFUSED, RequestState.EXPIRED, RequestState.CANCELLED},
        (RequestState.REFUSED, RequestState.APPROVED),
    ),
    (
        INVITATION_TRANSITIONS,
        Invitation,
        {InvitationState.ACCEPTED, InvitationState.DECLINED, InvitationState.REVOKED},
        (InvitationState.ACCEPTED, InvitationState.REVOKED),
    ),
]
IDS = [machine.name for machine, *_ in MACHINES]


def _field(model: type[models.Model]) -> models.Field[str, str]:
    return model._meta.get_field("state")  # type: ignore[return-value]  # every machine's model has a CharField `state`


@pytest.mark.parametrize(("machine", "model", "final", "forbidden"), MACHINES, ids=IDS)
def test_the_table_covers_the_model_states_and_moves_only_between_them(
    machine: Transitions[Any], model: type[models.Model], final: set[str], forbidden: tuple[str, str]
) -> None:
    stored = {value for value, _ in _field(model).choices or []}
    assert set(machine) == stored
    assert all(targets <= stored for targets in machine.values())
    assert all(state not in machine[state] for state in machine), "a state never moves to itself"


@pytest.mark.parametrize(("machine", "model", "final", "forbidden"), MACHINES, ids=IDS)
def test_every_state_is_reached_from_the_first_and_only_final_states_are_dead_ends(
    machine: Transitions[Any], model: type[models.Model], final: set[str], forbidden: tuple[str, str]
) -> None:
    first = _field(model).default
    assert (machine.reachable_from(first) | {first}) == set(machine)
    assert machine.terminal() == final
    # From anywhere that is not final, some move leads on; from a final state, none.
    assert all(bool(machine[state]) == (state not in final) for state in machine)


@pytest.mark.parametrize(("machine", "model", "final", "forbidden"), MACHINES, ids=IDS)
def test_a_forbidden_move_raises_and_touches_no_row(
    machine: Transitions[Any], model: type[models.Model], final: set[str], forbidden: tuple[str, str]
) -> None:
    current, target = forbidden
    assert not machine.allows(current, target)
    with pytest.raises(ForbiddenTransition, match=f"{machine.name}: cannot go from {current} to {target}"):
        machine.check(current, target)
    # `move` refuses before it builds the UPDATE: an unevaluated queryset of no rows is enough to show it.
    with pytest.raises(ForbiddenTransition):
        machine.move(model._default_manager.none(), from_states=[current], to_state=target)
    allowed = next(iter(machine[current])) if machine[current] else None
    with pytest.raises(ForbiddenTransition):  # one bad source among good ones is enough
        machine.check_all([*([allowed] if allowed else []), current], target)


def test_a_table_naming_an_unknown_state_or_missing_one_is_refused_when_built() -> None:
    unknown: dict[Any, Any] = {state: set() for state in DeliveryState} | {DeliveryState.PENDING: {"lost"}}
    with pytest.raises(ValueError, match="'lost' is not a valid DeliveryState"):
        Transitions("broken", DeliveryState, unknown)
    with pytest.raises(ValueError, match="every state"):
        Transitions("partial", DeliveryState, {DeliveryState.PENDING: {DeliveryState.SENDING}})


# Writes of a machine's `state` that do not go through `Transitions.move`, each with its reason. A new one fails
# this test: move the state with the machine's `move`, or call its `check` and add it here saying why.
CHECKED_BY_HAND = {
    # One UPDATE takes a never-launched victim through preempted to hibernated or pending; both hops are checked.
    ("jobs/scheduler/commit.py", "WorkloadState.HIBERNATED"),
    ("jobs/scheduler/commit.py", "WorkloadState.PENDING"),
    # Replicas have no lifecycle table: a replica's state is what its node last reported.
    ("jobs/services/watchdog.py", "ReplicaState.LOST"),
}
APPS = ("accounting", "common", "frontend", "gpucloud", "inventory", "jobs", "notifications", "tenants")


def _state_writes() -> set[tuple[str, str]]:
    found = set()
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
                    for keyword in node.keywords:
                        if keyword.arg == "state":
                            found.add((path.relative_to(ROOT).as_posix(), ast.unparse(keyword.value)))
    return found


def test_states_are_written_only_through_the_helper() -> None:
    writes = _state_writes()
    # The helper itself is the one place that writes `state=` for a table.
    assert writes - CHECKED_BY_HAND == {("common/transitions.py", "target")}
