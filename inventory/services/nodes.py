"""Writes of nodes: registration and the lifecycle (cordon, drain, maintenance, retire, outages).

Every state change goes through `transition_node`: a compare-and-swap on
the state checked against the transition table, one NodeEvent and one audit
entry, all in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from common.errors import Conflict, FieldErrors, add_errors, gather, invalid, raise_errors
from inventory.choices import LIVE_STATES, NODE_TRANSITIONS, REASON_REQUIRED, NodeKind, NodeState, RuntimeKind
from inventory.holds import holds_on_nodes
from inventory.models import Gpu, Node, NodeEvent, NodePool
from notifications.services import notify_node_health
from tenants.context import SYSTEM, Actor
from tenants.services import record_audit_event, snapshot, update_audited
from tenants.services.access import require_operator
from tenants.services.validation import clean_fields

NODE_FIELDS = ["name", "pool", "kind", "runtime", "address", "labels", "cpu_cores", "memory_mib", "simulated_gpu_count"]
NODE_COLUMNS = frozenset([*NODE_FIELDS, "simulated_gpu_model"])
"""The columns a registration sets."""
MAX_SIMULATED_GPUS = 64
MAX_LABELS = 64


class IllegalTransition(Conflict):
    """The lifecycle does not allow the requested change from the node's current state (409)."""

    def __init__(self, node: Node, target: NodeState | str) -> None:
        super().__init__(
            f"Node {node.name} is {node.state}; it cannot become {target}.",
            code="illegal_transition",
            details={"current_state": node.state, "requested_state": str(target)},
        )


def record_node_event(
    node: Node,
    *,
    kind: str,
    message: str,
    actor: Actor = SYSTEM,
    gpu: Gpu | None = None,
    data: dict[str, Any] | None = None,
    from_state: str = "",
    to_state: str = "",
) -> NodeEvent:
    """Append one event to `node`'s history and return it."""
    return NodeEvent.objects.create(
        node=node,
        gpu=gpu,
        kind=kind,
        message=message[:4000],
        data=data or {},
        actor_label=actor.label,
        from_state=from_state,
        to_state=to_state,
    )


def transition_node(
    node: Node, target: NodeState, *, actor: Actor, reason: str = "", action: str, **changes: Any
) -> Node:
    """Move `node` to `target` and return it refreshed; must run inside a transaction.

    Raises IllegalTransition when the table forbids it or when the state moved
    under us (compare-and-swap on the state read). `changes` are extra column
    values written by the same UPDATE.
    """
    current = Node.objects.filter(pk=node.pk).values_list("state", flat=True).first()
    if current is None or not NODE_TRANSITIONS.allows(current, target):
        node.state = current or node.state
        raise IllegalTransition(node, target)
    now = timezone.now()
    updated = NODE_TRANSITIONS.move(
        Node.objects.filter(pk=node.pk),
        from_states=[current],
        to_state=target,
        state_reason=reason,
        state_changed_at=now,
        updated_at=now,
        **changes,
    )
    if updated != 1:
        raise IllegalTransition(node, target)
    node.refresh_from_db()
    message = f"{current} → {target}" + (f": {reason}" if reason else "")
    record_node_event(
        node, kind="node.state_changed", message=message, actor=actor, from_state=current, to_state=target
    )
    if NodeState.UNREACHABLE in (current, target) or NodeState.FAILED in (current, target):
        notify_node_health(node=node.name, summary=message, data={"from_state": current, "to_state": str(target)})
    record_audit_event(
        actor=actor,
        action=action,
        obj=node,
        tenant_id=None,
        before={"state": current},
        after={"state": str(target), "reason": reason},
    )
    return node


def _require_reason(target: NodeState, reason: str) -> str:
    reason = reason.strip()
    if target in REASON_REQUIRED and not reason:
        raise invalid("reason", "required", f"Say why the node becomes {target}.")
    if len(reason) > 2000:
        raise invalid("reason", "max_length", "Keep the reason under 2,000 characters.")
    return reason


def _check_labels(labels: dict[str, Any]) -> None:
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise invalid("labels", "invalid", f"Labels are a mapping of at most {MAX_LABELS} string pairs.")
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str) or not key or len(key) > 63 or len(value) > 255:
            raise invalid("labels", "invalid", f"Label {key!r}: keys are 1-63 characters, values strings ≤ 255.")


def _check_simulation(runtime: str, gpu_count: int, model: str) -> None:
    if runtime == RuntimeKind.SIMULATED:
        if not 0 <= gpu_count <= MAX_SIMULATED_GPUS:
            raise invalid(
                "simulated_gpu_count", "out_of_range", f"A simulated node has 0 to {MAX_SIMULATED_GPUS} GPUs."
            )
    elif gpu_count or model:
        raise invalid("simulated_gpu_count", "simulated_only", "Only simulated nodes declare their GPUs.")


def registration_errors(values: Mapping[str, Any]) -> FieldErrors:
    """Return every rule the node registration `values` break, by field; an empty dict when none.

    Judges only the fields given (an interface that refused some passes the
    rest): labels, the simulation fields, each field's declared rules, a
    taken name. One field is judged by one rule at a time.
    """
    errors: FieldErrors = {}
    if "labels" in values:
        gather(errors, lambda: _check_labels(values["labels"]))
    if "runtime" in values:
        count, model = values.get("simulated_gpu_count", 0), values.get("simulated_gpu_model", "")
        gather(errors, lambda: _check_simulation(values["runtime"], count, model))
    columns = {name: value for name, value in values.items() if name in NODE_COLUMNS}
    unjudged = [field.name for field in Node._meta.fields if field.name not in columns or field.name in errors]
    gather(errors, lambda: clean_fields(Node(**columns), exclude=unjudged))
    if "name" in columns and "name" not in errors and Node.objects.filter(name=columns["name"]).exists():
        add_errors(errors, invalid("name", "unique", f"A node named {columns['name']!r} already exists."))
    return errors


@transaction.atomic
def register_node(
    *,
    actor: Actor,
    name: str,
    pool: NodePool,
    kind: str = NodeKind.BARE_METAL,
    runtime: str = RuntimeKind.DOCKER,
    address: str = "",
    labels: dict[str, str] | None = None,
    cpu_cores: int = 0,
    memory_mib: int = 0,
    simulated_gpu_count: int = 0,
    simulated_gpu_model: str = "",
) -> Node:
    """Register a node in state `registered`; operators only.

    Raises one ValidationError naming every failing field with its rule
    (`registration_errors`); nothing is written then.
    """
    require_operator(actor)
    values: dict[str, Any] = {
        "name": name,
        "pool": pool,
        "kind": kind,
        "runtime": runtime,
        "address": address,
        "labels": labels or {},
        "cpu_cores": cpu_cores,
        "memory_mib": memory_mib,
        "simulated_gpu_count": simulated_gpu_count,
        "simulated_gpu_model": simulated_gpu_model,
    }
    raise_errors(registration_errors(values))
    if runtime == RuntimeKind.SIMULATED and not simulated_gpu_model and simulated_gpu_count:
        values["simulated_gpu_model"] = "NVIDIA H100 80GB HBM3"
    node = Node(**values)
    node.save()
    record_node_event(node, kind="node.registered", message=f"Registered in pool {pool.name}", actor=actor)
    record_audit_event(actor=actor, action="node.register", obj=node, tenant_id=None, after=snapshot(node, NODE_FIELDS))
    return node


@transaction.atomic
def update_node(
    *,
    actor: Actor,
    node: Node,
    pool: NodePool | None = None,
    address: str | None = None,
    labels: dict[str, str] | None = None,
) -> Node:
    """Change a node's pool, address or labels; operators only.

    Moving a node to another pool needs it out of service (no holds on its
    GPUs and not ready), so no placement straddles two pools' quotas.
    """
    require_operator(actor)
    node = Node.objects.select_for_update().get(pk=node.pk)
    changes: dict[str, object] = {}
    errors: FieldErrors = {}
    if labels is not None:
        gather(errors, lambda: _check_labels(labels))
        changes["labels"] = labels
    if address is not None:
        changes["address"] = address
    if pool is not None and pool.pk != node.pool_id:
        if node.state == NodeState.READY or holds_on_nodes([node.pk]).get(node.pk, 0):
            raise Conflict(
                "Cordon the node and let its workloads finish before moving it to another pool.",
                code="node_in_service",
                details={"current_state": node.state},
            )
        changes["pool"] = pool
    return update_audited(
        actor=actor, action="node.update", obj=node, changes=changes, tenant_id=None, audited=NODE_FIELDS, errors=errors
    )


def _locked(node: Node) -> Node:
    return Node.objects.select_for_update().get(pk=node.pk)


@transaction.atomic
def cordon_node(*, actor: Actor, node: Node, reason: str) -> Node:
    """Stop new placements on a ready node; running work continues. Reason required; raises IllegalTransition."""
    require_operator(actor)
    reason = _require_reason(NodeState.CORDONED, reason)
    return transition_node(_locked(node), NodeState.CORDONED, actor=actor, reason=reason, action="node.cordon")


@transaction.atomic
def uncordon_node(*, actor: Actor, node: Node) -> Node:
    """Return a cordoned, draining or maintenance node to service (cancels a drain); raises IllegalTransition."""
    require_operator(actor)
    return transition_node(_locked(node), NodeState.READY, actor=actor, action="node.uncordon")


@transaction.atomic
def drain_node(*, actor: Actor, node: Node, reason: str) -> Node:
    """Stop new placements and reach maintenance once nothing holds the node's GPUs. Reason required."""
    require_operator(actor)
    reason = _require_reason(NodeState.DRAINING, reason)
    node = transition_node(_locked(node), NodeState.DRAINING, actor=actor, reason=reason, action="node.drain")
    return _settle(node, actor=actor)


@transaction.atomic
def enter_maintenance(*, actor: Actor, node: Node, reason: str) -> Node:
    """Put a node into maintenance, draining it first; raises Conflict while its GPUs are held.

    From ready or cordoned the node passes through draining (both
    transitions recorded); it never skips the rule that nothing may hold its GPUs.
    """
    require_operator(actor)
    reason = _require_reason(NodeState.MAINTENANCE, reason)
    node = _locked(node)
    held = holds_on_nodes([node.pk]).get(node.pk, 0)
    if held:
        raise Conflict(
            f"{held} GPU allocation(s) still hold node {node.name}; drain it and wait for them to finish.",
            code="node_busy",
            details={"current_state": node.state, "active_holds": held},
        )
    if node.state in (NodeState.READY, NodeState.CORDONED):
        node = transition_node(node, NodeState.DRAINING, actor=actor, reason=reason, action="node.drain")
    return transition_node(node, NodeState.MAINTENANCE, actor=actor, reason=reason, action="node.maintenance")


@transaction.atomic
def retire_node(*, actor: Actor, node: Node, reason: str = "") -> Node:
    """Take a node out of the cloud for good; raises IllegalTransition outside maintenance, failed or registered."""
    require_operator(actor)
    node = _locked(node)
    if not NODE_TRANSITIONS.allows(node.state, NodeState.RETIRED):
        raise IllegalTransition(node, NodeState.RETIRED)
    if holds_on_nodes([node.pk]).get(node.pk, 0):
        raise Conflict("GPUs of this node are still held.", code="node_busy", details={"current_state": node.state})
    node = transition_node(node, NodeState.RETIRED, actor=actor, reason=reason.strip(), action="node.retire")
    Gpu.objects.filter(node=node).update(present=False)
    # A retired node's agent is refused at its next request anyway; revoking also ends its waiting poll.
    from inventory.services.agents import revoke_credentials  # agents builds on this module

    revoke_credentials(node, actor=actor, reason="node retired")
    return node


def _settle(node: Node, *, actor: Actor) -> Node:
    if node.state == NodeState.DRAINING and not holds_on_nodes([node.pk]).get(node.pk, 0):
        return transition_node(
            node,
            NodeState.MAINTENANCE,
            actor=actor,
            reason=node.state_reason or "drained",
            action="node.maintenance",
        )
    return node


def settle_draining_nodes() -> int:
    """Move every draining node whose GPUs nobody holds to maintenance; return how many moved. Idempotent."""
    draining = list(Node.objects.filter(state=NodeState.DRAINING).values_list("pk", flat=True))
    holds = holds_on_nodes(draining)
    moved = 0
    for node_id in draining:
        if holds.get(node_id, 0):
            continue
        with transaction.atomic():
            node = Node.objects.select_for_update().filter(pk=node_id, state=NodeState.DRAINING).first()
            if node is not None and _settle(node, actor=SYSTEM).state == NodeState.MAINTENANCE:
                moved += 1
    return moved


def mark_unreachable_nodes(*, timeout: timedelta, now: datetime | None = None) -> list[str]:
    """Mark live nodes without a heartbeat for `timeout` unreachable; return their names. Idempotent.

    A node that never sent a heartbeat counts from its last state change.
    """
    now = now or timezone.now()
    cutoff = now - timeout
    stale = Node.objects.filter(state__in=LIVE_STATES)
    stale = stale.filter(last_heartbeat_at__lt=cutoff) | stale.filter(
        last_heartbeat_at=None, state_changed_at__lt=cutoff
    )
    names: list[str] = []
    for node in stale:
        with transaction.atomic():
            locked = Node.objects.select_for_update().get(pk=node.pk)
            if locked.state not in LIVE_STATES:
                continue
            seconds = int(timeout.total_seconds())
            transition_node(
                locked,
                NodeState.UNREACHABLE,
                actor=SYSTEM,
                reason=f"no heartbeat from the agent for {seconds} s",
                action="node.unreachable",
                resume_state=locked.state,
            )
            names.append(locked.name)
    return names


def resume_node(node: Node) -> Node:
    """Return an unreachable node to the state its outage interrupted; must run inside a transaction."""
    target = NodeState(node.resume_state or NodeState.CORDONED)
    return transition_node(
        node, target, actor=SYSTEM, reason="heartbeats resumed", action="node.reachable", resume_state=""
    )
