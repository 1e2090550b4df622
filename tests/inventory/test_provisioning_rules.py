"""What a probe report must show before a node may serve, and how reports are applied."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from inventory import services
from inventory.choices import GpuHealth, NodeState
from inventory.models import Gpu, Node, NodeEvent
from inventory.services.provisioning import parse_version, provisioning_problems
from tenants.context import Actor
from tenants.models import AuditEvent
from tests.conftest import World
from tests.inventory.factories import make_node

H100 = {"index": 0, "uuid": "GPU-aaaa", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "mig_mode": "disabled"}


def report(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "agent_version": "0.1.0",
        "runtime": {
            "kind": "docker",
            "engine_version": "26.1.5",
            "runc_version": "1.1.12",
            "device_requests": True,
            "nvidia_runtime": True,
            "toolkit_version": "1.17.3",
            "cpu_cores": 64,
            "memory_mib": 515000,
        },
        "gpus": {"available": True, "gpus": [H100], "driver_version": "550.90.07", "cuda_version": "12.4"},
        "health_check": {"exit_code": 0, "state": "exited", "message": ""},
    }
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


def test_version_parsing() -> None:
    assert parse_version("1.17.3-1") == (1, 17, 3)
    assert parse_version("v26.1.5") == (26, 1, 5)
    assert parse_version(None) is None and parse_version("unknown") is None


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({}, None),
        (
            {"runtime": {"toolkit_version": "1.16.1"}},
            "NVIDIA container toolkit 1.16.1 is older than 1.16.2 (CVE-2024-0132)",
        ),
        ({"runtime": {"toolkit_version": "1.16.2"}}, None),
        (
            {"runtime": {"toolkit_version": None}},
            "NVIDIA container toolkit not found on a GPU node; install 1.16.2 or newer",
        ),
        ({"runtime": {"device_requests": False}}, "Docker Engine does not support device requests (GPUs by UUID)"),
        ({"runtime": {"engine_version": "19.03.1"}}, "Docker Engine 19.03.1 is older than 20.10"),
        ({"runtime": {"engine_version": None}}, "Docker Engine did not report its version"),
        ({"gpus": {"driver_version": None}}, "NVIDIA driver version unknown"),
        ({"health_check": {"exit_code": 1, "message": "nvidia-smi: not found"}},
         "health-check container exited with code 1: nvidia-smi: not found"),
        ({"error": {"step": "runtime", "message": "Docker Engine unreachable"}}, "runtime: Docker Engine unreachable"),
        # A host without GPUs needs no toolkit.
        ({"runtime": {"toolkit_version": None}, "gpus": {"available": False, "gpus": [], "reason": "no GPU"}}, None),
    ],
)  # fmt: skip
def test_provisioning_minimums(changes: dict[str, Any], problem: str | None) -> None:
    problems = provisioning_problems("docker", report(**changes))
    assert problems == ([problem] if problem else [])


def test_simulated_and_process_nodes_need_no_docker() -> None:
    sim = report(runtime={"kind": "simulated", "engine_version": None, "toolkit_version": None})
    assert provisioning_problems("simulated", sim) == []
    assert provisioning_problems("process", sim) == []


def _provisioning(world: World) -> Node:
    node = make_node(Actor(user=world.operator), world.pool, state=NodeState.REGISTERED, runtime="docker")
    return services.provision_node(actor=Actor(user=world.operator), node=node)


def test_a_good_report_makes_the_node_ready_with_versions_and_gpus(world: World) -> None:
    node = _provisioning(world)
    done = services.complete_provisioning(node_id=node.pk, attempt=1, report=report())
    assert done is not None and done.state == NodeState.READY
    node.refresh_from_db()
    assert (node.engine_version, node.runc_version, node.toolkit_version) == ("26.1.5", "1.1.12", "1.17.3")
    assert (node.nvidia_driver_version, node.cuda_version, node.cpu_cores) == ("550.90.07", "12.4", 64)
    gpu = Gpu.objects.get()
    assert (gpu.uuid, gpu.model, gpu.memory_mib, gpu.mig_mode, gpu.health) == (
        "GPU-aaaa", "NVIDIA H100 80GB HBM3", 81559, "disabled", GpuHealth.OK
    )  # fmt: skip
    assert AuditEvent.all_tenants.filter(action="node.ready", object_id=str(node.pk)).count() == 1


def test_the_probe_records_the_nodes_swarm_and_role(world: World) -> None:
    node = _provisioning(world)
    swarm = {"swarm": "abc123", "swarm_manager": True}
    services.complete_provisioning(node_id=node.pk, attempt=1, report=report(runtime=swarm))
    node.refresh_from_db()
    assert (node.swarm, node.swarm_manager) == ("abc123", True)


@pytest.mark.parametrize(
    ("runtime", "recorded"),
    [
        ({"swarm": "", "swarm_manager": True}, ("", False)),  # no manager of no swarm
        ({}, (None, False)),  # an agent older than the report: unknown, not "in no swarm"
    ],
)
def test_a_node_in_no_swarm_or_that_never_said(
    world: World, runtime: dict[str, Any], recorded: tuple[Any, ...]
) -> None:
    node = _provisioning(world)
    services.complete_provisioning(node_id=node.pk, attempt=1, report=report(runtime=runtime))
    node.refresh_from_db()
    assert (node.swarm, node.swarm_manager) == recorded


def test_an_old_toolkit_fails_the_node_with_the_reason_and_keeps_versions(world: World) -> None:
    node = _provisioning(world)
    services.complete_provisioning(node_id=node.pk, attempt=1, report=report(runtime={"toolkit_version": "1.14.0"}))
    node.refresh_from_db()
    assert node.state == NodeState.FAILED
    assert node.state_reason == "NVIDIA container toolkit 1.14.0 is older than 1.16.2 (CVE-2024-0132)"
    assert node.toolkit_version == "1.14.0"
    assert not Gpu.objects.exists()


def test_stale_and_repeated_reports_change_nothing(world: World) -> None:
    node = _provisioning(world)
    assert services.complete_provisioning(node_id=node.pk, attempt=0, report=report()) is None
    assert services.complete_provisioning(node_id=node.pk, attempt=1, report=report()) is not None
    events = NodeEvent.objects.count()
    assert services.complete_provisioning(node_id=node.pk, attempt=1, report=report()) is None
    assert NodeEvent.objects.count() == events


def test_reprovisioning_resets_health_and_marks_missing_gpus(world: World) -> None:
    node = _provisioning(world)
    second = {**H100, "index": 1, "uuid": "GPU-bbbb"}
    services.complete_provisioning(node_id=node.pk, attempt=1, report=report(gpus={"gpus": [H100, second]}))
    Gpu.objects.filter(uuid="GPU-aaaa").update(health=GpuHealth.FAILED, health_reason="XID 79")
    operator = Actor(user=world.operator)
    services.enter_maintenance(actor=operator, node=node, reason="replace GPU 1")
    services.provision_node(actor=operator, node=node)
    services.complete_provisioning(node_id=node.pk, attempt=2, report=report())
    assert dict(Gpu.objects.values_list("uuid", "present")) == {"GPU-aaaa": True, "GPU-bbbb": False}
    assert Gpu.objects.get(uuid="GPU-aaaa").health == GpuHealth.OK
    assert NodeEvent.objects.filter(kind="gpu.missing").count() == 1


def test_provisioning_that_never_hears_back_fails_with_a_hint(world: World) -> None:
    node = _provisioning(world)
    timeout = timedelta(seconds=600)
    assert services.fail_stalled_provisioning(timeout=timeout) == []
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(state_changed_at=timezone.now() - timedelta(seconds=601))
    assert services.fail_stalled_provisioning(timeout=timeout) == ["n1"]
    node.refresh_from_db()
    assert node.state == NodeState.FAILED
    assert "did not answer within 600 s; is `gpucloud agent --node n1` running?" in node.state_reason
