"""Request-path services and live selectors read through the scoped managers, under their workload's tenant.

They are called from API views and pages (a request scope of the actor's
tenant), from tasks and the CLI (no scope) and from live consumers (no
scope): each enters its own tenant's scope for its reads and writes, so it
works with none active, answers the same under another tenant's scope,
restores the caller's scope, and never returns another tenant's rows.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from common.errors import Conflict
from inventory.models import Node
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Allocation, Workload
from jobs.selectors import live_rows_of_tenant, live_workload_state
from jobs.services import cancel_workload, restart_workload
from jobs.services.idle import extend_notebook
from tenants.models import Project
from tenants.scoping import active_tenant_id, tenant_scope
from tests.conftest import World, actor
from tests.jobs.factories import ready_world

pytestmark = pytest.mark.django_db


def _workload(
    world: World, project: Project, *, name: str, state: str = WorkloadState.PENDING, **fields: object
) -> Workload:
    owner = world.member_a if project.tenant_id == world.tenant_a.pk else world.admin_b
    return Workload.all_tenants.create(
        tenant_id=project.tenant_id,
        project=project,
        owner=owner,
        name=name,
        image="local",
        pool=world.pool,
        state=state,
        attempt=1,
        **fields,
    )


def _hold(workload: Workload, node: Node) -> None:
    Allocation.all_tenants.create(tenant_id=workload.tenant_id, workload=workload, replica=0, node=node)


def test_an_action_with_no_scope_active_acts_in_its_workloads_tenant(world: World) -> None:
    job = _workload(world, world.project_a, name="job")
    assert active_tenant_id() is None
    cancelled = cancel_workload(actor=actor(world.member_a), workload=job)
    assert (cancelled.state, cancelled.project.slug) == (WorkloadState.CANCELLED, "alpha")
    assert active_tenant_id() is None, "the service's scope ends with it"


def test_an_action_under_the_actors_request_scope_keeps_that_scope(world: World) -> None:
    job = _workload(world, world.project_a, name="job")
    with tenant_scope(world.tenant_a):
        assert cancel_workload(actor=actor(world.admin_a), workload=job).state == WorkloadState.CANCELLED
        assert active_tenant_id() == world.tenant_a.pk


def test_restart_sees_its_own_unreleased_gpus_out_of_scope_and_not_another_tenants(world: World) -> None:
    ready_world(world)
    node = Node.objects.get()
    stopping = _workload(world, world.project_a, name="stopping", state=WorkloadState.FAILED)
    _hold(stopping, node)
    with pytest.raises(Conflict) as refused:
        restart_workload(actor=actor(world.member_a), workload=stopping)
    assert refused.value.code == "still_stopping"
    mine = _workload(world, world.project_a, name="mine", state=WorkloadState.FAILED)
    _hold(_workload(world, world.project_b, name="theirs", state=WorkloadState.FAILED), node)
    restarted = restart_workload(actor=actor(world.member_a), workload=mine)
    assert (restarted.state, restarted.attempt) == (WorkloadState.PENDING, 2), "another tenant's GPUs are not its own"
    assert active_tenant_id() is None


def test_extending_a_notebook_with_no_scope_active_moves_only_that_notebook(world: World) -> None:
    warned = timezone.now() - timedelta(minutes=5)
    fields = {"kind": WorkloadKind.NOTEBOOK, "idle_warned_at": warned}
    mine = _workload(world, world.project_a, name="nb", state=WorkloadState.RUNNING, **fields)
    theirs = _workload(world, world.project_b, name="nb", state=WorkloadState.RUNNING, **fields)
    extended = extend_notebook(actor=actor(world.member_a), workload=mine)
    assert extended.idle_extended_at is not None and extended.idle_warned_at is None
    theirs.refresh_from_db()
    assert (theirs.idle_extended_at, theirs.idle_warned_at) == (None, warned)
    assert active_tenant_id() is None


def test_the_live_rows_of_a_tenant_are_its_own_whatever_scope_is_active(world: World) -> None:
    _workload(world, world.project_a, name="a-job")
    _workload(world, world.project_b, name="b-job")
    assert [row["name"] for row in live_rows_of_tenant(world.tenant_a)] == ["a-job"]
    with tenant_scope(world.tenant_b):
        assert [row["name"] for row in live_rows_of_tenant(world.tenant_a)] == ["a-job"]
        assert active_tenant_id() == world.tenant_b.pk
    assert [row["name"] for row in live_rows_of_tenant(world.tenant_b, project_id=world.project_a.pk)] == []


def test_a_live_stream_reads_its_workloads_state_with_no_scope_active(world: World) -> None:
    job = Workload.all_tenants.select_related("tenant").get(pk=_workload(world, world.project_a, name="job").pk)
    assert live_workload_state(job) == WorkloadState.PENDING
    Workload.all_tenants.filter(pk=job.pk).delete()
    assert live_workload_state(job) is None
