"""Nodes in a given state, made through the services as an operator would."""

from __future__ import annotations

from django.db import transaction

from inventory.choices import NodeState
from inventory.models import Gpu, Node, NodePool
from inventory.services import register_node, transition_node
from tenants.context import Actor

# How an operator's actions reach each state from `registered`.
PATHS: dict[NodeState, list[NodeState]] = {
    NodeState.REGISTERED: [],
    NodeState.PROVISIONING: [NodeState.PROVISIONING],
    NodeState.READY: [NodeState.PROVISIONING, NodeState.READY],
    NodeState.FAILED: [NodeState.PROVISIONING, NodeState.FAILED],
    NodeState.CORDONED: [NodeState.PROVISIONING, NodeState.READY, NodeState.CORDONED],
    NodeState.DRAINING: [NodeState.PROVISIONING, NodeState.READY, NodeState.DRAINING],
    NodeState.MAINTENANCE: [NodeState.PROVISIONING, NodeState.READY, NodeState.DRAINING, NodeState.MAINTENANCE],
    NodeState.UNREACHABLE: [NodeState.PROVISIONING, NodeState.READY, NodeState.UNREACHABLE],
    NodeState.RETIRED: [NodeState.RETIRED],
}


def make_node(
    operator: Actor, pool: NodePool, *, name: str = "n1", state: NodeState = NodeState.READY, gpus: int = 0, **kwargs
) -> Node:
    """Register a simulated node, walk it to `state` and give it `gpus` GPUs."""
    kwargs.setdefault("runtime", "simulated")
    node = register_node(actor=operator, name=name, pool=pool, **kwargs)
    with transaction.atomic():
        for step in PATHS[state]:
            extra = {"resume_state": NodeState.READY} if step == NodeState.UNREACHABLE else {}
            node = transition_node(node, step, actor=operator, reason="setup", action=f"node.{step}", **extra)
    for index in range(gpus):
        Gpu.objects.create(node=node, index=index, uuid=f"GPU-{name}-{index}", model="NVIDIA H100 80GB HBM3")
    return node
