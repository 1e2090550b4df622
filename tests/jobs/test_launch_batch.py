"""Launching a pass's placements as one batch: a fixed number of queries, and one bad workload holds back none.

A pass places thousands of workloads at once (docs/scale.md: 8,000 in 90 s
on 1,000 simulated nodes); launching them one transaction and some twenty
queries each kept the controller minutes behind. These tests count the
queries of a batch and break one workload of a batch on purpose.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from common.protocol.messages import ReplicaSpec
from inventory.models import Node
from jobs import services
from jobs.choices import WorkloadState
from jobs.models import Replica, ReplicaState, Workload, WorkloadEvent
from jobs.scheduler.shell import run_pass
from jobs.services import execution
from tenants.context import Actor
from tests.conftest import World
from tests.jobs.factories import add_node, assign, give_quota, request

pytestmark = pytest.mark.django_db


def _placed(world: World, count: int) -> list[int]:
    """Submit `count` one-GPU jobs of member_a and place them all; return their ids."""
    give_quota(world, limit=count)
    for index in range((count + 7) // 8):
        add_node(world, f"batch-{index}")
    Node.objects.update(cpu_cores=64, memory_mib=512_000)
    assign(world.member_a, world.project_a)
    actor = Actor(user=world.member_a)
    ids = [
        services.submit_workload(actor=actor, project=world.project_a, data=request(world, name=f"job-{i}")).pk
        for i in range(count)
    ]
    run_pass()
    states = set(Workload.all_tenants.filter(pk__in=ids).values_list("state", "reason_message"))
    assert states == {(WorkloadState.SCHEDULED, "")}, states
    return ids


def _launch_queries(ids: list[int]) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as queries:
        sent = execution.launch_workloads(workload_ids=ids)
    return sent, len(queries.captured_queries)


def test_a_batch_costs_the_same_queries_whatever_its_size(world: World) -> None:
    ids = _placed(world, 16)  # the tenant's limit
    sent_few, few = _launch_queries(ids[:2])
    sent_many, many = _launch_queries(ids[2:])
    assert (sent_few, sent_many) == (2, 14)
    assert many <= few + 2, f"2 workloads took {few} queries, 14 took {many}: the cost grows with the batch"
    assert set(Workload.all_tenants.filter(pk__in=ids).values_list("state", flat=True)) == {WorkloadState.STARTING}
    assert Replica.all_tenants.filter(workload_id__in=ids, state=ReplicaState.LAUNCHING).count() == 16
    starting = WorkloadEvent.all_tenants.filter(workload_id__in=ids, to_state=WorkloadState.STARTING)
    assert starting.count() == 16 and set(starting.values_list("message", flat=True)) == {"Starting 1 replica."}


def test_a_workload_that_cannot_be_launched_holds_back_none_of_its_batch(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _placed(world, 6)
    broken = ids[2]
    real_spec = execution.replica_spec

    def spec(workload: Workload, *args: Any, **kwargs: Any) -> ReplicaSpec:
        if workload.pk == broken:
            raise ValueError("a storage plan that cannot be made")
        return real_spec(workload, *args, **kwargs)

    monkeypatch.setattr(execution, "replica_spec", spec)
    assert execution.launch_workloads(workload_ids=ids) == 5
    states = dict(Workload.all_tenants.filter(pk__in=ids).values_list("pk", "state"))
    assert states.pop(broken) == WorkloadState.SCHEDULED, "left for reconcile and the start timeout"
    assert set(states.values()) == {WorkloadState.STARTING}
    assert not Replica.all_tenants.filter(workload_id=broken).exists(), "nothing of it was half written"
