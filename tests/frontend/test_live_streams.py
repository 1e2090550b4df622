"""Live GPU metrics (a workload's GPUs only, a node's all), workload events after real passes, cluster coalescing."""

from __future__ import annotations

import time
from dataclasses import asdict
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.utils import timezone

from inventory.agent.reporter import node_gpu_group
from inventory.agent.transport import publish_samples
from inventory.drivers.base import GpuSample
from inventory.models import Gpu, GpuMinute, Node
from jobs.choices import WorkloadState
from jobs.models import Workload
from jobs.services import submit_workload, transition_workload
from tenants.context import Actor
from tests.conftest import World
from tests.frontend import live
from tests.frontend.live import open_stream, receive, session_headers
from tests.jobs.factories import add_node, ready_world, request, run_pass_now

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_live_layer")]
fresh_live_layer = live.fresh_live_layer

PROTOCOL_FIELDS = {
    "uuid",
    "index",
    "utilization_gpu",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "temperature_c",
}


def _samples(node: str, count: int, utilization: float) -> list[dict[str, Any]]:
    return [
        asdict(
            GpuSample(
                uuid=f"GPU-{node}-{i}",
                index=i,
                timestamp=time.time(),
                utilization_gpu=utilization + i,
                memory_used_mib=1000 + i,
                memory_total_mib=81920,
                power_w=300.0,
                temperature_c=60.0,
                sm_clock_mhz=1980,
            )
        )
        for i in range(count)
    ]


def _placeable(world: World) -> World:
    """The ready world, with CPU and memory on n1 so that passes place work there."""
    ready_world(world)
    Node.objects.filter(name="n1").update(cpu_cores=64, memory_mib=512_000)
    return world


def _submit(world: World, gpus: int, name: str = "train") -> Workload:
    return submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, name=name, gpus_per_replica=gpus)
    )


async def _drain(stream: Any, quiet: float = 0.5) -> list[dict[str, Any]]:
    """Return the messages that arrive until none comes for `quiet` seconds."""
    messages = []
    while not await stream.receive_nothing(timeout=quiet):
        messages.append(await receive(stream))
    return messages


def test_a_workloads_metrics_carry_only_its_gpus(world: World) -> None:
    _placeable(world)
    mine = _submit(world, 2)
    _submit(world, 3, name="other")
    run_pass_now()
    headers = session_headers(world.viewer_a)

    async def scenario() -> None:
        stream, _, _ = await open_stream(f"/ws/workloads/{mine.pk}/metrics/", headers=headers)
        allocations = await receive(stream)
        assert allocations["type"] == "allocations"
        held = {gpu["uuid"] for gpu in allocations["gpus"]}
        assert len(held) == 2 and {gpu["node"] for gpu in allocations["gpus"]} == {"n1"}
        assert set(allocations["gpus"][0]) == {"uuid", "index", "node", "model"}
        samples = _samples("n1", 8, 10.0)
        publish_samples(node_gpu_group("n1"), samples)
        message = await receive(stream)
        assert message["type"] == "gpus" and message["node"] == "n1"
        sampled = max(sample["timestamp"] for sample in samples if sample["uuid"] in held)
        assert message["at"] == sampled, "stamped when sampled, not when sent"
        assert {gpu["uuid"] for gpu in message["gpus"]} == held
        assert all(set(gpu) == PROTOCOL_FIELDS for gpu in message["gpus"])
        # Ended: its GPUs are released, the stream says so and forwards nothing more.
        await database_sync_to_async(_cancel_and_release)(mine.pk)
        assert await receive(stream) == {"type": "allocations", "gpus": []}
        publish_samples(node_gpu_group("n1"), _samples("n1", 8, 20.0))
        assert await stream.receive_nothing(timeout=0.5)
        await stream.disconnect()

    async_to_sync(scenario)()


def _cancel_and_release(workload_id: int) -> None:
    from jobs.services import release_allocations

    assert transition_workload(
        workload_id=workload_id, from_states=[WorkloadState.SCHEDULED], to_state=WorkloadState.CANCELLED
    )
    assert release_allocations(workload_id=workload_id) == 2


def test_a_nodes_metrics_carry_its_history_then_every_gpu_for_operators(world: World) -> None:
    add_node(world, "n1", gpus=2)
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=5)
    GpuMinute.objects.create(
        gpu=Gpu.objects.get(uuid="GPU-n1-1"),
        minute=minute,
        samples=60,
        utilization_sum=60 * 40.0,
        utilization_max=90.0,
        memory_used_max_mib=2048,
    )
    headers = session_headers(world.operator)

    async def scenario() -> None:
        stream, _, _ = await open_stream("/ws/nodes/n1/metrics/", headers=headers)
        first = await receive(stream)
        assert first["type"] == "node" and first["name"] == "n1" and first["pool"] == "shared"
        assert [gpu["uuid"] for gpu in first["gpus"]] == ["GPU-n1-0", "GPU-n1-1"]
        history = await receive(stream)
        assert history == {"type": "history", "gpus": {"GPU-n1-1": [[int(minute.timestamp()), 40.0, 90.0, 2048]]}}
        publish_samples(node_gpu_group("n1"), _samples("n1", 2, 50.0))
        message = await receive(stream)
        assert [gpu["utilization_gpu"] for gpu in message["gpus"]] == [50.0, 51.0]
        await stream.disconnect()

    async_to_sync(scenario)()


def test_events_follow_state_and_queue_position_changes_of_real_passes(world: World) -> None:
    _placeable(world)
    submitted = [_submit(world, 4, name=f"job{i}") for i in range(4)]
    headers = session_headers(world.viewer_a)

    async def scenario() -> None:
        stream, _, _ = await open_stream("/ws/t/tenant-a/events/?project=alpha", headers=headers)
        snapshot = await receive(stream)
        assert snapshot["type"] == "snapshot"
        assert [row["id"] for row in snapshot["workloads"]] == [w.pk for w in submitted]
        assert set(snapshot["workloads"][0]) == {
            "id",
            "project",
            "name",
            "kind",
            "state",
            "reason_code",
            "reason",
            "queue_position",
            "updated_at",
        }
        await database_sync_to_async(run_pass_now)()
        latest = {message["id"]: message for message in await _drain(stream)}
        assert all(message["type"] == "workload" for message in latest.values())
        assert await database_sync_to_async(_rows_match)(latest)
        assert [latest[w.pk]["state"] for w in submitted] == ["scheduled", "scheduled", "pending", "pending"]
        before = latest[submitted[3].pk]["queue_position"]
        assert before is not None
        # The first waiting job is cancelled: the next pass moves the last one up the queue.
        await database_sync_to_async(transition_workload)(
            workload_id=submitted[2].pk, from_states=[WorkloadState.PENDING], to_state=WorkloadState.CANCELLED
        )
        await database_sync_to_async(run_pass_now)()
        latest = {message["id"]: message for message in await _drain(stream)}
        assert latest[submitted[2].pk]["state"] == "cancelled"
        assert latest[submitted[3].pk]["queue_position"] < before
        assert await database_sync_to_async(_rows_match)(latest)
        await stream.disconnect()

    async_to_sync(scenario)()


def _rows_match(latest: dict[int, dict[str, Any]]) -> bool:
    stored = Workload.all_tenants.in_bulk(list(latest))
    return all(
        (row["state"], row["reason_code"], row["queue_position"])
        == (stored[pk].state, stored[pk].reason_code, stored[pk].queue_position)
        for pk, row in latest.items()
    )


def test_events_of_another_project_are_not_sent(world: World) -> None:
    from tenants.models import Project

    _placeable(world)
    Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    headers = session_headers(world.admin_a)

    async def scenario() -> None:
        stream, _, _ = await open_stream("/ws/t/tenant-a/events/?project=gamma", headers=headers)
        assert await receive(stream) == {"type": "snapshot", "workloads": []}
        await database_sync_to_async(_submit)(world, 1)
        assert await stream.receive_nothing(timeout=0.5)
        await stream.disconnect()

    async_to_sync(scenario)()


def test_the_cluster_stream_coalesces_samples_into_one_message_a_second(world: World) -> None:
    add_node(world, "n1", gpus=2)
    add_node(world, "n2", gpus=1)
    headers = session_headers(world.operator)

    async def scenario() -> None:
        stream, _, _ = await open_stream("/ws/cluster/", headers=headers)
        layout = await receive(stream)
        assert layout["type"] == "cluster"
        assert [(node["name"], len(node["gpus"])) for node in layout["nodes"]] == [("n1", 2), ("n2", 1)]
        holders = await receive(stream)
        assert holders == {"type": "holders", "workloads": {}, "nodes": {"n1": [None, None], "n2": [None]}}
        for utilization in (10.0, 30.0):
            publish_samples(node_gpu_group("n1"), _samples("n1", 2, utilization))
        publish_samples(node_gpu_group("n2"), _samples("n2", 1, 70.0))
        messages = [await receive(stream, timeout=3)]
        messages += await _drain(stream, quiet=1.3)
        merged: dict[str, Any] = {}
        for message in messages:
            assert message["type"] == "utilization"
            merged.update(message["nodes"])
        assert merged == {"n1": [30.0, 31.0], "n2": [70.0]}
        assert len(messages) <= 2  # one per second: both nodes at once, unless a tick fell between the sends
        await stream.disconnect()

    async_to_sync(scenario)()
