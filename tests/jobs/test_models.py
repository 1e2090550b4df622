"""Single-row invariants the database holds whatever the code does, the lifecycle table, and the drain hold."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from inventory import services as inventory_services
from inventory.choices import NodeState
from inventory.holds import holds_on_nodes
from jobs.choices import (
    ACTIVE_STATES,
    PRIORITY_VALUES,
    TERMINAL_STATES,
    WORKLOAD_TRANSITIONS,
    ReasonCode,
    WorkloadState,
)
from jobs.models import Allocation, Workload
from jobs.scheduler.core import Reason
from tenants.context import Actor
from tests.conftest import World
from tests.jobs.factories import add_node

pytestmark = pytest.mark.django_db


def _workload(world: World, **fields: Any) -> Workload:
    values: dict[str, Any] = {
        "tenant": world.tenant_a,
        "project": world.project_a,
        "owner": world.member_a,
        "name": "train",
        "image": "busybox:1",
        "pool": world.pool,
        **fields,
    }
    return Workload.all_tenants.create(**values)


def _allocate(workload: Workload, gpu: Any, *, replica: int = 0, released: bool = False) -> Allocation:
    return Allocation.all_tenants.create(
        tenant_id=workload.tenant_id,
        workload=workload,
        replica=replica,
        node=gpu.node,
        gpu=gpu,
        released_at=timezone.now() if released else None,
    )


def test_the_database_refuses_one_gpu_in_two_active_allocations(world: World) -> None:
    gpu = add_node(world, gpus=1).gpus.get()
    first, second = _workload(world), _workload(world, name="other")
    _allocate(first, gpu)
    with pytest.raises(IntegrityError, match=r"one_active_allocation_per_gpu|UNIQUE"), transaction.atomic():
        _allocate(second, gpu)


def test_a_released_allocation_frees_the_gpu_for_the_next(world: World) -> None:
    gpu = add_node(world, gpus=1).gpus.get()
    first, second = _workload(world), _workload(world, name="other")
    _allocate(first, gpu, released=True)
    _allocate(first, gpu, released=True)  # history may repeat the GPU
    _allocate(second, gpu)
    assert Allocation.all_tenants.filter(gpu=gpu, released_at__isnull=True).count() == 1


def test_cpu_only_replicas_share_a_node_without_a_gpu(world: World) -> None:
    node = add_node(world, gpus=0)
    workload = _workload(world, gpus_per_replica=0, replicas=2)
    for replica in range(2):
        Allocation.all_tenants.create(tenant=world.tenant_a, workload=workload, replica=replica, node=node)
    assert Allocation.all_tenants.filter(node=node, gpu__isnull=True).count() == 2


@pytest.mark.parametrize(
    "fields",
    [{"gpus_per_replica": 65}, {"replicas": 0}, {"replicas": 65}],
    ids=["too-many-gpus", "no-replica", "too-many-replicas"],
)
def test_size_constraints(world: World, fields: dict[str, int]) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        _workload(world, **fields)


def test_an_idempotency_key_is_unique_per_owner_and_tenant_but_may_be_absent(world: World) -> None:
    _workload(world, idempotency_key="k1")
    _workload(world, idempotency_key=None)
    _workload(world, idempotency_key=None)
    _workload(world, idempotency_key="k1", owner=world.admin_a)
    with pytest.raises(IntegrityError), transaction.atomic():
        _workload(world, idempotency_key="k1")


def test_priority_follows_the_class(world: World) -> None:
    assert [_workload(world, priority_class=c).priority for c in ("low", "normal", "high")] == [0, 50, 100]
    assert PRIORITY_VALUES == {"low": 0, "normal": 50, "high": 100}


def test_the_transition_table() -> None:
    assert WORKLOAD_TRANSITIONS[WorkloadState.PENDING] == {WorkloadState.SCHEDULED, WorkloadState.CANCELLED}
    assert WORKLOAD_TRANSITIONS.allows("preempted", "pending")
    assert not WORKLOAD_TRANSITIONS.allows("pending", "running")
    assert all(WORKLOAD_TRANSITIONS[state] == {WorkloadState.PENDING} for state in TERMINAL_STATES)
    assert set(ACTIVE_STATES) == {WorkloadState.SCHEDULED, WorkloadState.STARTING, WorkloadState.RUNNING}
    assert set(WORKLOAD_TRANSITIONS) == set(WorkloadState)


def test_reason_codes_cover_every_reason_of_the_core() -> None:
    assert {r.value for r in Reason} <= set(ReasonCode.values)
    assert {"CANCELLED_BY_USER", "PREEMPTED"} <= set(ReasonCode.values)


def test_active_allocations_hold_a_draining_node_out_of_maintenance(world: World) -> None:
    operator = Actor(user=world.operator)
    node = add_node(world, gpus=2)
    workload = _workload(world)
    allocation = _allocate(workload, node.gpus.get(index=0))
    assert holds_on_nodes([node.pk]) == {node.pk: 1}
    node = inventory_services.drain_node(actor=operator, node=node, reason="swap a fan")
    assert node.state == NodeState.DRAINING
    assert inventory_services.settle_draining_nodes() == 0
    Allocation.all_tenants.filter(pk=allocation.pk).update(released_at=timezone.now())
    assert holds_on_nodes([node.pk]) == {}
    assert inventory_services.settle_draining_nodes() == 1
    node.refresh_from_db()
    assert node.state == NodeState.MAINTENANCE
