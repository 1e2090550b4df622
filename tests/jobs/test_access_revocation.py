"""Work stops when its owner loses access: a removed member, a deactivated account, a deactivated tenant.

The end-to-end test runs a real job on the process runtime through a real
worker and agent (the fixtures of tests/jobs/test_execution.py): removing
its owner asks the controller for the sweep, which stops it. The others
check the sweep's decisions on the ledger alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from jobs.choices import ReasonCode, WorkloadKind, WorkloadState
from jobs.models import Workload
from jobs.services.revocation import orphaned_workloads, stop_orphaned_work
from notifications.choices import EventKind
from notifications.models import Delivery, Notification
from tenants import services as tenant_services
from tenants.context import Actor
from tenants.models import AuditEvent, Membership
from tenants.scoping import tenant_scope
from tests.conftest import World
from tests.jobs.factories import add_node, add_replica, run_pass_now
from tests.jobs.test_execution import _active_allocations, _reached, _submit, _world, agent  # noqa: F401
from tests.workers import wait_until

LOOP = "import time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.05)\n"


def _remove(world: World, user: Any) -> None:
    membership = Membership.all_tenants.get(tenant=world.tenant_a, user=user)
    with tenant_scope(world.tenant_a):
        tenant_services.remove_member(actor=Actor(user=world.admin_a), membership=membership)


def _audited(workload: Workload) -> list[tuple[str, int | None, Any]]:
    events = AuditEvent.all_tenants.filter(action="workload.stop_access_revoked", object_id=str(workload.pk))
    return [(e.actor_label, e.tenant_id, e.after) for e in events]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("agent")
def test_removing_a_member_stops_their_running_job_with_a_reason_an_audit_event_and_a_notice(
    world: World, settings: Any
) -> None:
    settings.NOTIFICATIONS_EMAIL = True  # workload.stopped is e-mailed by default: nobody opted in here
    _world(world)
    job = _submit(world, LOOP)
    run_pass_now()
    job = _reached(job, WorkloadState.RUNNING)
    _remove(world, world.member_a)
    # Nobody calls the sweep here: the removal asked the controller's worker for it on commit.
    stopped = _reached(job, WorkloadState.CANCELLED, timeout=30)
    assert (stopped.reason_code, stopped.reason_message) == (
        ReasonCode.ACCESS_REVOKED,
        "Stopped: owner removed from tenant.",
    )
    assert wait_until(lambda: _active_allocations(job) == 0, timeout=30), "its GPUs are freed once it exited"
    assert _audited(job) == [
        ("system", world.tenant_a.pk, {"state": "cancelled", "reason": "owner removed from tenant"})
    ]
    notice = Notification.all_tenants.get(kind=EventKind.WORKLOAD_STOPPED)
    assert notice.tenant_id == world.tenant_a.pk and "owner removed from tenant" in notice.body
    assert (notice.payload["state"], notice.payload["reason_code"]) == ("cancelled", "ACCESS_REVOKED")
    told = set(Delivery.all_tenants.filter(notification=notice).values_list("address", flat=True))
    assert told == {"member_a@example.com", "admin_a@example.com"}


def _workload(world: World, node: Any, *, kind: str, state: str, name: str) -> Workload:
    workload = add_replica(world, node, state=state, name=name).workload
    Workload.all_tenants.filter(pk=workload.pk).update(kind=kind)
    return Workload.all_tenants.get(pk=workload.pk)


def _reason(workload: Workload) -> tuple[str, str, str]:
    found = Workload.all_tenants.get(pk=workload.pk)
    return found.state, found.reason_code, found.reason_message


def test_a_removed_members_notebooks_hibernate_and_queued_work_is_cancelled(world: World) -> None:
    node = add_node(world)
    running = _workload(world, node, kind=WorkloadKind.NOTEBOOK, state=WorkloadState.RUNNING, name="nb")
    queued = _workload(world, node, kind=WorkloadKind.NOTEBOOK, state=WorkloadState.PENDING, name="nb2")
    job = _workload(world, node, kind=WorkloadKind.JOB, state=WorkloadState.PENDING, name="job")
    asleep = _workload(world, node, kind=WorkloadKind.NOTEBOOK, state=WorkloadState.HIBERNATED, name="nb3")
    assert stop_orphaned_work() == 0, "a member's work is left alone"
    _remove(world, world.member_a)
    assert stop_orphaned_work() == 3
    hibernated = "Hibernated: owner removed from tenant. Its files are kept."
    assert _reason(running) == ("hibernated", ReasonCode.ACCESS_REVOKED, hibernated)
    assert _reason(queued) == ("cancelled", ReasonCode.ACCESS_REVOKED, "Stopped: owner removed from tenant.")
    assert _reason(job) == ("cancelled", ReasonCode.ACCESS_REVOKED, "Stopped: owner removed from tenant.")
    assert _reason(asleep)[0] == "hibernated" and _reason(asleep)[1] != ReasonCode.ACCESS_REVOKED
    assert stop_orphaned_work() == 0, "a second sweep finds nothing more to do"
    assert len(_audited(running) + _audited(queued) + _audited(job)) == 3


def test_a_deactivated_account_or_tenant_stops_the_work_and_says_which(world: World) -> None:
    node = add_node(world)
    job = _workload(world, node, kind=WorkloadKind.JOB, state=WorkloadState.RUNNING, name="a")
    world.member_a.is_active = False
    world.member_a.save(update_fields=["is_active"])
    assert stop_orphaned_work() == 1
    assert _reason(job)[2] == "Stopped: owner's account deactivated."
    world.member_a.is_active = True
    world.member_a.save(update_fields=["is_active"])
    other = _workload(world, node, kind=WorkloadKind.JOB, state=WorkloadState.RUNNING, name="b")
    tenant_services.update_tenant(actor=Actor(user=world.operator), tenant=world.tenant_a, is_active=False)
    assert stop_orphaned_work() == 1
    assert _reason(other)[2] == "Stopped: tenant deactivated."


def test_an_operators_work_in_a_tenant_they_are_no_member_of_is_left_alone(world: World) -> None:
    node = add_node(world)
    job = _workload(world, node, kind=WorkloadKind.JOB, state=WorkloadState.RUNNING, name="ops")
    Workload.all_tenants.filter(pk=job.pk).update(owner=world.operator)
    assert not orphaned_workloads().exists()
    assert stop_orphaned_work() == 0
