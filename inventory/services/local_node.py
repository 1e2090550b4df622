"""This machine as a node: what a first `gpucloud up` in embedded mode registers, so a notebook runs at once.

The console's own agent serves the node named GPUCLOUD_NODE_NAME (`local`);
registering it by hand was the newcomer's first chore. The node goes into a
pool of its own (`local`) so its CPU-only capacity never mixes with GPU pools'
quotas, and through the normal workflow: registered, then provisioned by that
agent's probe, like any node.
"""

from __future__ import annotations

from django.db import transaction

from inventory.choices import NodeKind, RuntimeKind
from inventory.models import Node, NodePool
from inventory.services.nodes import register_node
from inventory.services.pools import create_node_pool
from inventory.services.provisioning import provision_node
from tenants.context import Actor
from tenants.services.access import require_operator

LOCAL_POOL = "local"
LOCAL_LABEL = "gpucloud.local"
# The notebook image the node offers (the process runtime ignores images; its presets still name one).
NOTEBOOK_IMAGE_LABEL = "gpucloud.notebook-image"
LOCAL_RUNTIMES = (RuntimeKind.DOCKER, RuntimeKind.PROCESS)


@transaction.atomic
def register_local_node(*, actor: Actor, name: str, runtime: str, image: str) -> Node:
    """Register this machine as node `name` with `runtime` (docker or process) in pool `local`, and provision it.

    `image` is the notebook image it offers, kept in its labels for the launch presets that point at it.

    Operators only (PermissionDenied). Returns the node of that name
    unchanged when one exists, so asking twice registers once. The pool is
    created when missing; the probe is sent once the transaction commits
    (the console's own agent answers it).
    """
    require_operator(actor)
    if runtime not in LOCAL_RUNTIMES:
        raise ValueError(f"this machine runs workloads with docker or process, not {runtime!r}")
    existing = Node.objects.filter(name=name).first()
    if existing is not None:
        return existing
    pool = NodePool.objects.filter(name=LOCAL_POOL).first() or create_node_pool(
        actor=actor, name=LOCAL_POOL, description="This machine: the console's own node, for notebooks without GPUs."
    )
    node = register_node(
        actor=actor,
        name=name,
        pool=pool,
        kind=NodeKind.CONTAINER_HOST,
        runtime=runtime,
        address="127.0.0.1",
        labels={LOCAL_LABEL: "true", NOTEBOOK_IMAGE_LABEL: image},
    )
    return provision_node(actor=actor, node=node)


def local_notebook_image() -> str | None:
    """Return the notebook image this machine's node offers, or None when no node was registered for it."""
    node = Node.objects.filter(pool__name=LOCAL_POOL, labels__has_key=NOTEBOOK_IMAGE_LABEL).first()
    return str(node.labels[NOTEBOOK_IMAGE_LABEL]) if node is not None else None
