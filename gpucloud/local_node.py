"""This machine as node `local` in embedded mode: decided at `gpucloud up`, registered on a first start.

A first start on a database without any node registers the machine the
console runs on (GPUCLOUD_NODE_NAME) so a notebook without GPUs runs at
once (`GPUCLOUD_LOCAL_NODE`: auto, docker, process or off; see
`embedded.plan_local_node`). Later starts keep whatever the operator made of
it, and never register it again once other nodes exist. Explicit settings
win: GPUCLOUD_AGENT_PROCESS_RUNTIME, NOTEBOOK_COMMAND and the health-check
image are only defaulted here when the environment does not set them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from gpucloud.embedded import LocalNodePlan, plan_local_node
from gpucloud.env import env_str
from inventory.choices import RuntimeKind
from inventory.drivers.process import NOBODY, NotRunnable, check_runnable
from inventory.models import Node
from inventory.services.local_node import LOCAL_LABEL, LOCAL_POOL, NOTEBOOK_IMAGE_LABEL, register_local_node
from tenants.context import Actor

MODES = ("auto", "docker", "process", "off")


def mode() -> str:
    """Return GPUCLOUD_LOCAL_NODE (default auto); raises ImproperlyConfigured for anything but MODES.

    Read here, not in settings: only `gpucloud up` asks, once.
    """
    value = (env_str("GPUCLOUD_LOCAL_NODE", "auto") or "auto").lower()
    if value not in MODES:
        raise ImproperlyConfigured(f"GPUCLOUD_LOCAL_NODE={value!r}: use {', '.join(MODES)}.")
    return value


def notebook_image() -> str:
    """Return GPUCLOUD_LOCAL_NOTEBOOK_IMAGE: the image built from this host's files for a docker `local` node."""
    return env_str("GPUCLOUD_LOCAL_NOTEBOOK_IMAGE", "gpucloud/jupyter:local") or "gpucloud/jupyter:local"


def plan(*, root: Path, say: Callable[[str], None]) -> LocalNodePlan:
    """Return how this machine serves as a node now, deciding (and building an image) only on a first start."""
    name = settings.GPUCLOUD_NODE_NAME
    node = Node.objects.filter(name=name).first()
    if node is not None:
        runtime = node.runtime if node.runtime in (RuntimeKind.DOCKER, RuntimeKind.PROCESS) else None
        image = str(node.labels.get(NOTEBOOK_IMAGE_LABEL, "")) if node.labels.get(LOCAL_LABEL) else ""
        return LocalNodePlan(runtime, f"node {name} ({node.get_runtime_display()}, {node.get_state_display()})", image)
    if Node.objects.exists():
        return LocalNodePlan(None, f"not a node (register one named {name} under Operate → Nodes to use it)")
    chosen = mode()
    if chosen != "off":
        say(f"Setting up this machine as node {name} (GPUCLOUD_LOCAL_NODE={chosen}) ...")
    return plan_local_node(chosen, process_allowed=_process_runtime_allowed(), image=notebook_image(), root=root)


def _process_runtime_allowed() -> bool:
    """The process runtime is allowed unless GPUCLOUD_AGENT_PROCESS_RUNTIME says no in so many words."""
    return settings.GPUCLOUD_AGENT_PROCESS_RUNTIME or "GPUCLOUD_AGENT_PROCESS_RUNTIME" not in os.environ


def process_enabled(plan: LocalNodePlan) -> bool:
    """Return whether the embedded agent runs process-runtime work: as configured, or for a process `local` node."""
    local_process = plan.runtime == RuntimeKind.PROCESS and _process_runtime_allowed()
    return settings.GPUCLOUD_AGENT_PROCESS_RUNTIME or local_process


def _apply_defaults(plan: LocalNodePlan) -> None:
    """Default the settings the local node's notebooks and health check need, where the environment is silent.

    Notebooks run JupyterLab with the interpreter that has it: this one for
    the process runtime, the image's python3 for docker (the image has no
    `jupyter` script). The docker health check runs the local image instead
    of pulling busybox.
    """
    if plan.runtime is None or (plan.runtime == RuntimeKind.DOCKER and not plan.image):
        return  # a docker node of the operator's own making runs the operator's images
    if "NOTEBOOK_COMMAND" not in os.environ:
        settings.NOTEBOOK_COMMAND = plan.notebook_command
    if plan.runtime == RuntimeKind.DOCKER and "GPUCLOUD_HEALTHCHECK_IMAGE" not in os.environ:
        settings.GPUCLOUD_HEALTHCHECK_IMAGE = plan.image
        if "GPUCLOUD_HEALTHCHECK_COMMAND" not in os.environ:
            settings.GPUCLOUD_HEALTHCHECK_COMMAND = ["python3", "-c", "pass"]


def _unrunnable_note(plan: LocalNodePlan) -> str:
    """Say so when, run as root, the process runtime's workload user cannot run the notebook command."""
    if os.geteuid() != 0:
        return ""
    try:
        check_runnable(plan.notebook_command, None, NOBODY)
    except NotRunnable as error:
        return f"; notebooks will not start: {error.blocked} is closed to their unprivileged user (docs/execution.md)"
    return "; workloads run as unprivileged users"


def register(plan: LocalNodePlan, *, actor: Actor, node: str) -> str:
    """Register node `node` as `plan` says when it is missing, apply its defaults; return the banner's line for it."""
    _apply_defaults(plan)
    if plan.runtime is None:
        return plan.why
    existed = Node.objects.filter(name=node).exists()
    register_local_node(actor=actor, name=node, runtime=plan.runtime, image=plan.image or notebook_image())
    if existed:
        return plan.why
    if plan.runtime == RuntimeKind.PROCESS:
        kind = "process runtime: NOT isolated, for development only" + _unrunnable_note(plan)
    else:
        kind = f"docker runtime, notebook image {plan.image} (built here, nothing pulled)"
    return f"node {node} in pool {LOCAL_POOL}, {kind}; notebooks without GPUs run here"
