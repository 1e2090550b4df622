"""Agent reports: heartbeats, GPU samples, faults that fail GPUs and cordon nodes, outages."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from inventory import mailbox, selectors, services, tasks
from inventory.choices import GpuHealth, NodeState
from inventory.health import assess_sample, worsens
from inventory.models import Gpu, Node, NodeEvent
from tenants.context import Actor
from tenants.models import AuditEvent
from tests.conftest import World
from tests.inventory.factories import make_node


def _sample(uuid: str, index: int = 0, **fields: object) -> dict[str, object]:
    return {"uuid": uuid, "index": index, "timestamp": 0.0, "utilization_gpu": 40.0, "memory_used_mib": 1000, **fields}


@pytest.mark.parametrize(
    ("fields", "health", "reason"),
    [
        ({}, None, None),
        ({"lost": True}, GpuHealth.FAILED, "GPU has fallen off the bus (NVML reports it lost)"),
        ({"xid_events": [79]}, GpuHealth.FAILED, "XID 79: GPU has fallen off the bus"),
        ({"xid_events": [13, 48]}, GpuHealth.FAILED, "XID 48: double-bit ECC error"),
        ({"ecc_uncorrected": 3}, GpuHealth.FAILED, "3 uncorrectable ECC error(s)"),
        ({"ecc_uncorrected": None, "ecc_corrected": 12}, None, None),
        ({"xid_events": [92]}, GpuHealth.DEGRADED, "XID 92: high single-bit ECC error rate"),
        ({"xid_events": [13, 31, 43]}, None, None),  # application faults leave the GPU healthy
    ],
)
def test_assess_sample(fields: dict[str, object], health: GpuHealth | None, reason: str | None) -> None:
    verdict = assess_sample({**_sample("GPU-x"), **fields})
    assert (verdict.health if verdict else None, verdict.reason if verdict else None) == (health, reason)


def test_health_never_improves_from_samples() -> None:
    assert not worsens(GpuHealth.FAILED, assess_sample(_sample("g", xid_events=[92])))
    assert worsens(GpuHealth.DEGRADED, assess_sample(_sample("g", xid_events=[79])))
    assert not worsens(GpuHealth.OK, None)


def test_heartbeat_records_time_version_and_samples(world: World) -> None:
    node = make_node(Actor(user=world.operator), world.pool, gpus=2)
    report = {"node": "n1", "agent_version": "9.9", "samples": [_sample("GPU-n1-0"), _sample("GPU-n1-1", 1)]}
    assert services.record_heartbeats([report]) == 1
    node.refresh_from_db()
    assert node.last_heartbeat_at is not None and node.agent_version == "9.9"
    gpu = Gpu.objects.get(uuid="GPU-n1-1")
    assert gpu.last_sample is not None
    assert (gpu.utilization, gpu.memory_used_mib, gpu.last_sample["index"]) == (40.0, 1000, 1)


def test_heartbeat_cannot_write_samples_onto_another_nodes_gpu(world: World) -> None:
    operator = Actor(user=world.operator)
    make_node(operator, world.pool, gpus=1)
    make_node(operator, world.pool, name="n2", gpus=1)
    services.record_heartbeats([{"node": "n2", "samples": [_sample("GPU-n1-0", xid_events=[79])]}])
    assert Gpu.objects.get(uuid="GPU-n1-0").health == GpuHealth.OK


def test_fatal_xid_fails_the_gpu_cordons_the_node_and_is_never_offered(world: World) -> None:
    node = make_node(Actor(user=world.operator), world.pool, gpus=2)
    assert selectors.schedulable_gpus().count() == 2
    services.record_heartbeats([{"node": "n1", "samples": [_sample("GPU-n1-1", 1, xid_events=[79])]}])
    gpu = Gpu.objects.get(uuid="GPU-n1-1")
    assert (gpu.health, gpu.health_reason) == (GpuHealth.FAILED, "XID 79: GPU has fallen off the bus")
    node.refresh_from_db()
    assert node.state == NodeState.CORDONED
    assert node.state_reason == "GPU 1 failed: XID 79: GPU has fallen off the bus"
    kinds = list(NodeEvent.objects.filter(node=node).values_list("kind", flat=True)[:2])
    assert kinds == ["node.state_changed", "gpu.health_changed"]
    assert AuditEvent.all_tenants.filter(action="node.cordon", actor_label="system").exists()
    # Repeating the report changes nothing more.
    services.record_heartbeats([{"node": "n1", "samples": [_sample("GPU-n1-1", 1, xid_events=[79])]}])
    assert NodeEvent.objects.filter(kind="gpu.health_changed").count() == 1
    # A failed GPU is never offered, even once the node is uncordoned.
    services.uncordon_node(actor=Actor(user=world.operator), node=node)
    assert list(selectors.schedulable_gpus().values_list("uuid", flat=True)) == ["GPU-n1-0"]


def test_uncorrectable_ecc_and_lost_gpu_fail_it(world: World) -> None:
    make_node(Actor(user=world.operator), world.pool, gpus=2)
    services.record_heartbeats(
        [{"node": "n1", "samples": [_sample("GPU-n1-0", ecc_uncorrected=1), _sample("GPU-n1-1", 1, lost=True)]}]
    )
    assert set(Gpu.objects.values_list("health", flat=True)) == {GpuHealth.FAILED}
    assert Node.objects.get(name="n1").state == NodeState.CORDONED


def test_degraded_gpu_stays_schedulable_and_leaves_the_node_ready(world: World) -> None:
    make_node(Actor(user=world.operator), world.pool, gpus=1)
    services.record_heartbeats([{"node": "n1", "samples": [_sample("GPU-n1-0", xid_events=[94])]}])
    assert Gpu.objects.get().health == GpuHealth.DEGRADED
    assert Node.objects.get().state == NodeState.READY
    assert selectors.schedulable_gpus().count() == 1


def test_reports_of_unknown_nodes_are_ignored_and_remembered(world: World) -> None:
    assert services.record_heartbeats([{"node": "stranger", "samples": []}]) == 0
    assert "stranger" in selectors.unknown_agents()
    assert not Node.objects.exists()


def test_missing_heartbeats_make_live_nodes_unreachable_and_resuming_restores_them(world: World) -> None:
    operator = Actor(user=world.operator)
    ready = make_node(operator, world.pool)
    cordoned = make_node(operator, world.pool, name="n2", state=NodeState.CORDONED)
    registered = make_node(operator, world.pool, name="n3", state=NodeState.REGISTERED)
    services.record_heartbeats([{"node": "n1"}, {"node": "n2"}, {"node": "n3"}])
    timeout = timedelta(seconds=30)
    assert services.mark_unreachable_nodes(timeout=timeout) == []
    later = timezone.now() + timedelta(seconds=31)
    assert sorted(services.mark_unreachable_nodes(timeout=timeout, now=later)) == ["n1", "n2"]
    assert services.mark_unreachable_nodes(timeout=timeout, now=later) == []  # idempotent
    for node in (ready, cordoned, registered):
        node.refresh_from_db()
    assert (ready.state, cordoned.state, registered.state) == ("unreachable", "unreachable", "registered")
    assert ready.state_reason == "no heartbeat from the agent for 30 s"
    services.record_heartbeats([{"node": "n1"}, {"node": "n2"}])
    ready.refresh_from_db()
    cordoned.refresh_from_db()
    assert (ready.state, cordoned.state) == ("ready", "cordoned")
    assert ready.state_reason == "heartbeats resumed" and ready.resume_state == ""
    assert AuditEvent.all_tenants.filter(action="node.reachable").count() == 2


def test_node_that_never_reported_becomes_unreachable_after_the_timeout(world: World) -> None:
    make_node(Actor(user=world.operator), world.pool)
    later = timezone.now() + timedelta(minutes=5)
    assert services.mark_unreachable_nodes(timeout=timedelta(seconds=30), now=later) == ["n1"]


def test_a_gpu_reported_twice_in_a_batch_keeps_its_last_sample_and_the_first_ones_fault(world: World) -> None:
    make_node(Actor(user=world.operator), world.pool, gpus=1)
    first = {"node": "n1", "samples": [_sample("GPU-n1-0", utilization_gpu=10.0, xid_events=[94])]}
    second = {"node": "n1", "samples": [_sample("GPU-n1-0", utilization_gpu=70.0, memory_used_mib=None)]}
    assert services.record_heartbeats([first, second]) == 2
    gpu = Gpu.objects.get()
    assert (gpu.utilization, gpu.memory_used_mib, gpu.health) == (70.0, None, GpuHealth.DEGRADED)
    assert gpu.last_sample is not None and gpu.last_sample["utilization_gpu"] == 70.0


@pytest.mark.parametrize(("burst_seconds", "applied", "left"), [(0.0, 2, 0), (60.0, 1, 1)])
def test_a_slow_batch_is_followed_at_once_by_what_arrived_meanwhile(
    monkeypatch: pytest.MonkeyPatch, burst_seconds: float, applied: int, left: int
) -> None:
    """A batch that takes BURST_SECONDS or more (every 0 s batch does) drains the mailbox again in the same run."""
    mailbox.drain_reports(lambda reports: None)
    monkeypatch.setattr(tasks, "BURST_SECONDS", burst_seconds)
    batches: list[list[str]] = []

    def apply(reports: list[dict[str, object]]) -> int:
        if not batches:
            mailbox.post_report({"node": "late", "sent_at": time.time()})  # arrives while the first batch applies
        batches.append([str(report["node"]) for report in reports])
        return len(reports)

    monkeypatch.setattr(tasks.services, "apply_agent_reports", apply)
    mailbox.post_report({"node": "early", "sent_at": time.time()})
    assert tasks.apply_heartbeats() == applied
    assert batches == [["early"], ["late"]][:applied]
    assert mailbox.drain_reports(lambda reports: None) == left


def _silent_for(node: Node, seconds: int) -> None:
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def test_a_heartbeat_waiting_in_the_mailbox_keeps_its_node_alive(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller far behind: the node's report has been in the mailbox all along, unapplied. The node
    check applies it before judging, so the node is not declared lost for the controller's own lag."""
    from common import control

    monkeypatch.setattr(control, "_WATCHING_SINCE", time.monotonic() - 3600)
    mailbox.drain_reports(lambda reports: None)
    node = make_node(Actor(user=world.operator), world.pool)
    _silent_for(node, 120)
    mailbox.post_report({"node": "n1", "sent_at": time.time()})
    assert tasks.check_nodes()["unreachable"] == []
    node.refresh_from_db()
    assert node.state == NodeState.READY
    _silent_for(node, 120)  # and with nothing waiting, a silent node is lost as before
    assert tasks.check_nodes()["unreachable"] == ["n1"]


def test_a_controller_that_just_started_judges_no_node(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a restart, the minutes the controller was down are not the node's silence."""
    from common import control

    mailbox.drain_reports(lambda reports: None)
    node = make_node(Actor(user=world.operator), world.pool)
    _silent_for(node, 600)
    monkeypatch.setattr(control, "_WATCHING_SINCE", time.monotonic())
    assert tasks.check_nodes()["unreachable"] == []
    monkeypatch.setattr(control, "_WATCHING_SINCE", time.monotonic() - 31)
    assert tasks.check_nodes()["unreachable"] == ["n1"]
