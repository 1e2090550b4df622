"""Provisioning: bring a registered node to ready through its agent, or fail it with a precise reason.

The workflow is a Celery chain, safe to retry at every step:

1. `provision_node` moves the node to `provisioning`, bumps its attempt
   number and, once committed, sends `agent.probe_node` to the node's queue
   with `inventory.complete_provisioning` linked as its callback.
2. The agent probes the runtime, inventories the GPUs and runs the
   health-check container, and returns one JSON report (never raising).
3. `complete_provisioning` applies the report under the attempt it was
   started for: a stale or repeated report changes nothing.
4. `fail_stalled_provisioning` fails nodes whose agent never answered.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from celery import current_app as app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from common.protocol.messages import ProbeNode
from common.task_names import COMPLETE_PROVISIONING, PROVISION_NODE
from inventory.choices import GpuHealth, MigMode, NodeState, RuntimeKind
from inventory.models import Gpu, Node
from inventory.services.installation import installation_id
from inventory.services.nodes import record_node_event, transition_node
from tenants.context import SYSTEM, Actor
from tenants.services.access import require_operator

# CVE-2024-0132: container escape through the NVIDIA container toolkit before 1.16.2.
MIN_TOOLKIT = (1, 16, 2)
# Device requests (GPUs by UUID) need Engine API 1.40; 20.10 is the oldest Engine still patched by distributions.
MIN_DOCKER = (20, 10)
AGENT_TASK = ProbeNode.TASK
CALLBACK_TASK = COMPLETE_PROVISIONING


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """Return the leading dotted numbers of `text` as a tuple ('1.17.3-1' -> (1, 17, 3)), or None."""
    match = re.search(r"(\d+(?:\.\d+)*)", text or "")
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def _gpus_found(report: dict[str, Any]) -> list[dict[str, Any]]:
    inventory = report.get("gpus") or {}
    return list(inventory.get("gpus") or []) if inventory.get("available") else []


def _docker_problems(runtime: dict[str, Any], has_gpus: bool) -> list[str]:
    problems: list[str] = []
    engine = parse_version(runtime.get("engine_version"))
    if engine is None:
        return ["Docker Engine did not report its version"]
    if engine < MIN_DOCKER:
        problems.append(f"Docker Engine {runtime['engine_version']} is older than {'.'.join(map(str, MIN_DOCKER))}")
    if has_gpus:
        if not runtime.get("device_requests"):
            problems.append("Docker Engine does not support device requests (GPUs by UUID)")
        toolkit = parse_version(runtime.get("toolkit_version"))
        minimum = ".".join(map(str, MIN_TOOLKIT))
        if toolkit is None:
            problems.append(f"NVIDIA container toolkit not found on a GPU node; install {minimum} or newer")
        elif toolkit < MIN_TOOLKIT:
            problems.append(
                f"NVIDIA container toolkit {runtime['toolkit_version']} is older than {minimum} (CVE-2024-0132)"
            )
    return problems


def provisioning_problems(runtime_kind: str, report: dict[str, Any]) -> list[str]:
    """Return why `report` keeps a node of `runtime_kind` from service; empty when it may become ready.

    Pure: reads only the report the agent sent.
    """
    error = report.get("error")
    if error:
        return [f"{error.get('step', 'probe')}: {error.get('message', 'failed')}"]
    runtime = report.get("runtime") or {}
    gpus = _gpus_found(report)
    problems = _docker_problems(runtime, bool(gpus)) if runtime_kind == RuntimeKind.DOCKER else []
    if gpus and not (report.get("gpus") or {}).get("driver_version"):
        problems.append("NVIDIA driver version unknown")
    check = report.get("health_check") or {}
    if check.get("exit_code") != 0:
        detail = check.get("message") or check.get("state") or "did not run"
        problems.append(f"health-check container exited with code {check.get('exit_code')}: {detail}")
    return problems


def healthcheck_request(node: Node) -> dict[str, Any]:
    """Return what the agent runs to check the node: the image and the command."""
    return {"image": settings.GPUCLOUD_HEALTHCHECK_IMAGE, "command": list(settings.GPUCLOUD_HEALTHCHECK_COMMAND)}


def probe_request(node: Node) -> dict[str, Any]:
    """Return the JSON request the agent's `ProbeNode` carries for `node`'s current attempt."""
    return {
        "node": node.name,
        "attempt": node.provisioning_attempt,
        "runtime": node.runtime,
        # The check's container joins a network named after this console (`policy.tenant_network_name`).
        "installation": installation_id(),
        "health_check": healthcheck_request(node),
        "simulated_gpu_count": node.simulated_gpu_count,
        "simulated_gpu_model": node.simulated_gpu_model,
    }


def dispatch_probe(node_id: int, attempt: int) -> bool:
    """Send the probe of `attempt` to the node's agent with the completion linked; False when stale."""
    node = Node.objects.filter(pk=node_id).first()
    if node is None or node.state != NodeState.PROVISIONING or node.provisioning_attempt != attempt:
        return False
    callback = app.signature(CALLBACK_TASK, args=(node_id, attempt), queue="control")
    app.send_task(
        AGENT_TASK,
        args=(probe_request(node),),
        queue=node.agent_queue,
        link=callback,
        # A probe nobody picked up in time is pointless: provisioning has failed by then.
        expires=settings.NODE_PROVISION_TIMEOUT_SECONDS,
    )
    return True


@transaction.atomic
def provision_node(*, actor: Actor, node: Node) -> Node:
    """Start (or restart) provisioning; operators only. Raises IllegalTransition from ready or retired.

    The probe is sent once the transaction commits.
    """
    require_operator(actor)
    return begin_provisioning(node, actor=actor)


def begin_provisioning(node: Node, *, actor: Actor) -> Node:
    """Move `node` to provisioning with a new attempt and send its probe on commit; the caller checked rights.

    Must run inside a transaction. Raises IllegalTransition from ready or retired.
    """
    node = Node.objects.select_for_update().get(pk=node.pk)
    attempt = node.provisioning_attempt + 1
    node = transition_node(
        node,
        NodeState.PROVISIONING,
        actor=actor,
        reason=f"attempt {attempt}",
        action="node.provision",
        provisioning_attempt=attempt,
    )
    transaction.on_commit(lambda: app.send_task(PROVISION_NODE, args=(node.pk, attempt), queue="control"))
    return node


def _sync_gpus(node: Node, found: list[dict[str, Any]]) -> None:
    now = timezone.now()
    seen: set[str] = set()
    for info in found:
        uuid = str(info["uuid"])
        seen.add(uuid)
        gpu, created = Gpu.objects.update_or_create(
            uuid=uuid,
            defaults={
                "node": node,
                "index": int(info["index"]),
                "model": str(info.get("model", ""))[:100],
                "memory_mib": int(info.get("memory_mib") or 0),
                "mig_mode": info.get("mig_mode") or MigMode.UNSUPPORTED,
                "present": True,
                "health": GpuHealth.OK,
                "health_reason": "",
                "health_changed_at": now,
            },
        )
        if created:
            record_node_event(node, kind="gpu.found", gpu=gpu, message=f"GPU {gpu.index}: {gpu.model} ({uuid})")
    for gpu in Gpu.objects.filter(node=node, present=True).exclude(uuid__in=seen):
        gpu.present = False
        gpu.save(update_fields=["present"])
        record_node_event(node, kind="gpu.missing", gpu=gpu, message=f"GPU {gpu.index} ({gpu.uuid}) not found")


def _record_versions(node: Node, report: dict[str, Any]) -> None:
    runtime = report.get("runtime") or {}
    gpus = report.get("gpus") or {}
    swarm = runtime.get("swarm")
    Node.objects.filter(pk=node.pk).update(
        agent_version=str(report.get("agent_version") or "")[:40],
        engine_version=str(runtime.get("engine_version") or "")[:40],
        runc_version=str(runtime.get("runc_version") or "")[:40],
        toolkit_version=str(runtime.get("toolkit_version") or "")[:40],
        nvidia_runtime=bool(runtime.get("nvidia_runtime")),
        device_requests=bool(runtime.get("device_requests")),
        nvidia_driver_version=str(gpus.get("driver_version") or "")[:40],
        cuda_version=str(gpus.get("cuda_version") or "")[:40],
        cpu_cores=int(runtime.get("cpu_cores") or node.cpu_cores or 0),
        memory_mib=int(runtime.get("memory_mib") or node.memory_mib or 0),
        swarm=str(swarm)[:64] if swarm is not None else None,
        swarm_manager=bool(swarm) and bool(runtime.get("swarm_manager")),
        probed_at=timezone.now(),
    )


@transaction.atomic
def complete_provisioning(*, node_id: int, attempt: int, report: dict[str, Any]) -> Node | None:
    """Apply the agent's probe report: record versions and GPUs, then ready or failed with the reasons.

    Returns None, changing nothing, when the report is for another attempt
    or the node left provisioning meanwhile (a retried or late delivery).
    """
    node = Node.objects.select_for_update().filter(pk=node_id).first()
    if node is None or node.state != NodeState.PROVISIONING or node.provisioning_attempt != attempt:
        return None
    _record_versions(node, report)
    problems = provisioning_problems(node.runtime, report)
    if problems:
        return transition_node(
            node, NodeState.FAILED, actor=SYSTEM, reason="; ".join(problems), action="node.provisioning_failed"
        )
    found = _gpus_found(report)
    _sync_gpus(node, found)
    summary = f"{len(found)} GPU(s)" if found else f"no GPUs ({(report.get('gpus') or {}).get('reason', 'none')})"
    record_node_event(node, kind="node.probed", message=f"Probe passed: {summary}", data=_event_data(report))
    return transition_node(node, NodeState.READY, actor=SYSTEM, reason="", action="node.ready")


def _event_data(report: dict[str, Any]) -> dict[str, Any]:
    return {key: report.get(key) for key in ("agent_version", "runtime", "health_check")}


def fail_stalled_provisioning(*, timeout: timedelta) -> list[str]:
    """Fail nodes provisioning for longer than `timeout` (their agent never answered); return their names."""
    cutoff = timezone.now() - timeout
    names: list[str] = []
    for node in Node.objects.filter(state=NodeState.PROVISIONING, state_changed_at__lt=cutoff):
        with transaction.atomic():
            locked = Node.objects.select_for_update().get(pk=node.pk)
            if locked.state != NodeState.PROVISIONING or locked.state_changed_at >= cutoff:
                continue
            reason = (
                f"the agent on queue {locked.agent_queue} did not answer within {int(timeout.total_seconds())} s; "
                f"is `gpucloud agent --node {locked.name}` running?"
            )
            transition_node(locked, NodeState.FAILED, actor=SYSTEM, reason=reason, action="node.provisioning_failed")
            names.append(locked.name)
    return names
