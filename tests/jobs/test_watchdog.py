"""The periodic rules (lost nodes, time limits) and the ledger half of reconcile, on the ledger alone.

Messages to the agents are sent on commit; these tests run inside a
transaction that never commits, so they check what the ledger decided and
play the agents' reports themselves.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from common import control
from inventory.choices import NodeState, RuntimeKind
from inventory.drivers import policy
from inventory.drivers.simulated import SimulatedWorkload
from inventory.models import Node, NodeEvent
from inventory.services.installation import installation_id
from jobs import dispatch, services
from jobs.choices import ReasonCode, WorkloadKind, WorkloadState
from jobs.models import Allocation, AllowedImage, Replica, ReplicaState, Workload, WorkloadEvent
from jobs.scheduler.shell import run_pass
from jobs.services import execution, reconcile, replicas, watchdog
from jobs.services.execution import container_name, launch_workload
from tenants.context import Actor
from tenants.models import ProjectQuota
from tests.conftest import World
from tests.jobs.factories import ready_world, request

pytestmark = pytest.mark.django_db


def _running(world: World, **fields: Any) -> Workload:
    """Submit, place, launch and report started: a running workload on node n1."""
    workload = services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, **fields)
    )
    if workload.kind == WorkloadKind.NOTEBOOK:
        Workload.all_tenants.filter(pk=workload.pk).update(service_port=8888)
    run_pass()
    workload.refresh_from_db()
    launch_workload(workload=workload)
    workload.refresh_from_db()
    for row in Replica.all_tenants.filter(workload=workload, attempt=workload.attempt):
        replicas.record_replica_started(
            workload_id=workload.pk, attempt=row.attempt, replica=row.index, handle={"name": row.name}
        )
        if workload.kind == WorkloadKind.NOTEBOOK:
            replicas.record_replica_ready(workload_id=workload.pk, attempt=row.attempt, replica=row.index)
    workload.refresh_from_db()
    assert workload.state == WorkloadState.RUNNING
    return workload


def _ready(world: World) -> None:
    ready_world(world)
    Node.objects.filter(name="n1").update(cpu_cores=64, memory_mib=512_000)


def _lose_node() -> None:
    Node.objects.filter(name="n1").update(state=NodeState.UNREACHABLE)


def _held(workload: Workload) -> int:
    return Allocation.all_tenants.filter(workload=workload, released_at__isnull=True).count()


def test_a_lost_node_requeues_a_batch_job_until_its_requeue_limit_then_fails_it(world: World) -> None:
    _ready(world)
    job = _running(world, requeue_limit=1)
    _lose_node()
    assert watchdog.handle_lost_nodes() == 1
    job.refresh_from_db()
    assert (job.state, job.attempt, job.reason_code) == (WorkloadState.PENDING, 2, ReasonCode.NODE_LOST)
    assert _held(job) == 0 and Replica.all_tenants.get(workload=job, attempt=1).state == ReplicaState.LOST
    assert watchdog.handle_lost_nodes() == 0, "idempotent"
    Node.objects.filter(name="n1").update(state=NodeState.READY)
    job = _running_again(job)
    _lose_node()
    watchdog.handle_lost_nodes()
    job.refresh_from_db()
    assert (job.state, job.reason_code) == (WorkloadState.FAILED, ReasonCode.NODE_LOST)
    assert "used all 1 requeues" in job.reason_message and _held(job) == 0


def _running_again(job: Workload) -> Workload:
    run_pass()
    job.refresh_from_db()
    launch_workload(workload=job)
    row = Replica.all_tenants.get(workload=job, attempt=job.attempt)
    replicas.record_replica_started(workload_id=job.pk, attempt=job.attempt, replica=0, handle={"name": row.name})
    job.refresh_from_db()
    assert job.state == WorkloadState.RUNNING
    return job


def test_a_lost_node_ends_a_notebook_as_lost_and_tells_its_owner(world: World) -> None:
    _ready(world)
    notebook = _running(world, kind=WorkloadKind.NOTEBOOK)
    _lose_node()
    watchdog.handle_lost_nodes()
    notebook.refresh_from_db()
    assert (notebook.state, notebook.reason_code) == (WorkloadState.LOST, ReasonCode.NODE_LOST)
    assert "notebook session ended" in notebook.reason_message and _held(notebook) == 0


def test_maximum_runtime_fails_the_workload_and_frees_its_gpus_once_stopped(world: World) -> None:
    _ready(world)
    job = _running(world, max_runtime_seconds=120)
    assert watchdog.enforce_time_limits(now=timezone.now() + timedelta(seconds=60)) == {
        "max_runtime": 0,
        "start_timeout": 0,
    }
    watchdog.enforce_time_limits(now=timezone.now() + timedelta(seconds=121))
    job.refresh_from_db()
    assert (job.state, job.reason_code) == (WorkloadState.FAILED, ReasonCode.MAX_RUNTIME)
    assert job.stop_requested_at is not None and _held(job) == 1, "held until the node confirms the stop"
    replicas.record_replica_exited(workload_id=job.pk, attempt=1, replica=0, exit_code=143)
    assert _held(job) == 0
    job.refresh_from_db()
    assert job.state == WorkloadState.FAILED and job.reason_code == ReasonCode.MAX_RUNTIME, "the exit changes nothing"


def test_a_launch_stuck_past_the_start_timeout_fails(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ready(world)
    job = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    run_pass()
    settings.WORKLOAD_START_TIMEOUT_SECONDS = 60
    # A controller that has just started has not watched the launch: it gives it its full time.
    monkeypatch.setattr(control, "_WATCHING_SINCE", time.monotonic())
    assert watchdog.enforce_time_limits(now=timezone.now() + timedelta(seconds=61))["start_timeout"] == 0
    assert Workload.all_tenants.get(pk=job.pk).state == WorkloadState.SCHEDULED
    monkeypatch.setattr(control, "_WATCHING_SINCE", time.monotonic() - 61)
    watchdog.enforce_time_limits(now=timezone.now() + timedelta(seconds=61))
    job.refresh_from_db()
    assert (job.state, job.reason_code) == (WorkloadState.FAILED, ReasonCode.START_TIMEOUT)
    assert _held(job) == 0, "nothing was launched, so nothing to wait for"


def test_the_start_timeout_counts_from_the_launch_not_the_placement(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A placement whose launch waited in the controller's own queue gets its whole start time from the
    moment its node was asked: the controller's delay is never the workload's failure."""
    _ready(world)
    job = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    run_pass()
    settings.WORKLOAD_START_TIMEOUT_SECONDS = 60
    monkeypatch.setattr(control, "_WATCHING_SINCE", time.monotonic() - 3600)
    Workload.all_tenants.filter(pk=job.pk).update(scheduled_at=timezone.now() - timedelta(seconds=600))
    launch_workload(workload=Workload.all_tenants.get(pk=job.pk))  # the launch message's turn came only now
    assert watchdog.enforce_time_limits(now=timezone.now() + timedelta(seconds=30))["start_timeout"] == 0
    assert Workload.all_tenants.get(pk=job.pk).state == WorkloadState.STARTING
    assert watchdog.enforce_time_limits(now=timezone.now() + timedelta(seconds=61))["start_timeout"] == 1
    job.refresh_from_db()
    assert (job.state, job.reason_code) == (WorkloadState.FAILED, ReasonCode.START_TIMEOUT)


def test_the_controller_confirms_a_start_timeout_after_the_reports_ahead_of_it(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A simulated node's start is itself a message on the controller's queue: taken before the periodic
    check, it reports after it. The check therefore only names the overdue launches, in a message behind
    those reports; the confirmation fails only those still not started."""
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(dispatch, "send", lambda task, *, queue, kwargs: _record(sent, kwargs))
    monkeypatch.setattr(control, "_WATCHING_SINCE", time.monotonic() - 3600)
    settings.WORKLOAD_START_TIMEOUT_SECONDS = 60
    _ready(world)
    actor = Actor(user=world.member_a)
    late, lost = (
        services.submit_workload(actor=actor, project=world.project_a, data=request(world, name=name))
        for name in ("late", "lost")
    )
    run_pass()
    for job in (late, lost):
        launch_workload(workload=Workload.all_tenants.get(pk=job.pk))
    later = timezone.now() + timedelta(seconds=61)
    counts = watchdog.enforce_time_limits(now=later, confirm_later=True)
    assert (counts["start_timeout"], counts["start_timeout_to_confirm"]) == (0, 2)
    assert sent[-1]["workload_ids"] == [late.pk, lost.pk]
    # The late one's start report was in the queue ahead of the confirmation.
    replicas.record_replica_started(workload_id=late.pk, attempt=1, replica=0, handle={"name": "late"})
    assert (
        watchdog.fail_start_timeouts(sent[-1]["workload_ids"], cutoff=datetime.fromisoformat(sent[-1]["cutoff"])) == 1
    )
    assert Workload.all_tenants.get(pk=late.pk).state == WorkloadState.RUNNING
    failed = Workload.all_tenants.get(pk=lost.pk)
    assert (failed.state, failed.reason_code) == (WorkloadState.FAILED, ReasonCode.START_TIMEOUT)


def test_reconcile_releases_allocations_left_behind(world: World) -> None:
    _ready(world)
    job = _running(world)
    # A cancelled workload whose replica exit was recorded but whose allocation was not released
    # (a crash between the two, or a hand edit): reconcile releases it.
    Workload.all_tenants.filter(pk=job.pk).update(state=WorkloadState.CANCELLED)
    Replica.all_tenants.filter(workload=job).update(state=ReplicaState.EXITED)
    assert _held(job) == 1
    assert reconcile.reconcile_ledger()["released"] == 1
    assert _held(job) == 0


def test_reconcile_stops_orphans_and_records_replicas_the_node_says_are_gone(world: World) -> None:
    _ready(world)
    job = _running(world)
    _with_agent("n1")
    row = Replica.all_tenants.get(workload=job)
    orphan = {"name": container_name(999, 0, 1), "workload_id": "999", "attempt": 1, "replica": 0, "state": "running"}
    managed = [orphan | {"installation": installation_id(), "node": "n1"}]
    counts = reconcile.reconcile_node(node="n1", managed=managed, gone=[row.name])
    assert counts == {"orphans": 1, "vanished": 1, "watched": 0, "restarted": 0}
    assert NodeEvent.objects.filter(kind="node.orphan_stopped", data__name=container_name(999, 0, 1)).exists()
    job.refresh_from_db()
    assert (job.state, job.reason_code) == (WorkloadState.FAILED, ReasonCode.CONTAINER_VANISHED)
    assert _held(job) == 0 and Replica.all_tenants.get(pk=row.pk).state == ReplicaState.EXITED


def test_reconcile_leaves_another_installations_or_nodes_and_unlabelled_containers_alone(world: World) -> None:
    _ready(world)
    _with_agent("n1")
    base = {"workload_id": "999", "attempt": 1, "replica": 0, "state": "running"}
    managed = [
        base
        | {
            "name": policy.container_name("0123456789abcdef", 991, 0, 1),
            "installation": "0123456789abcdef",
            "node": "n1",
        },
        base | {"name": container_name(992, 0, 1), "installation": installation_id(), "node": "n2"},
        base | {"name": "gpucloud-w993-r0-a1"},  # started before owners were labelled, under the old name
    ]
    counts = reconcile.reconcile_node(node="n1", managed=managed, gone=[])
    assert counts["orphans"] == 0
    assert not NodeEvent.objects.filter(kind="node.orphan_stopped").exists()


def test_a_replica_missing_from_a_late_list_is_not_declared_vanished(world: World) -> None:
    """A list taken before the replica started, applied minutes later, proves nothing: only `gone` does."""
    _ready(world)
    job = _running(world)
    _with_agent("n1")
    Replica.all_tenants.filter(workload=job).update(created_at=timezone.now() - timedelta(minutes=10))
    assert reconcile.reconcile_node(node="n1", managed=[], gone=[]) == {
        "orphans": 0,
        "vanished": 0,
        "watched": 0,
        "restarted": 0,
    }
    job.refresh_from_db()
    assert job.state == WorkloadState.RUNNING


def test_a_simulated_replica_another_process_runs_is_never_vanished_nor_watched_twice(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A simulated node's work runs in whichever controller process takes it, and each knows only what it
    started: one that does not list a running replica (or calls it gone) says nothing of it. It is watched
    again from the ledger's handle only when its watcher must be gone: its run should have ended a while
    ago with no exit, or it started before this controller process did."""
    watched: list[dict[str, Any]] = []
    monkeypatch.setattr(dispatch, "send", lambda task, *, queue, kwargs: _record(watched, kwargs))
    _ready(world)
    job = _running(world)
    row = Replica.all_tenants.get(workload=job)

    def run(started: float, duration: float) -> None:
        workload = SimulatedWorkload(
            row.name, str(job.pk), "tenant-a", 1, 0, started_at=started, duration=duration,
            exit_code=0, utilization=0.5, log_interval=1.0,
        )  # fmt: skip
        Replica.all_tenants.filter(pk=row.pk).update(handle=workload.handle("n1"))

    run(time.time(), 300)  # another process runs and watches it
    counts = reconcile.reconcile_node(node="n1", managed=[], starting=[], gone=[row.name])
    assert (counts["vanished"], counts["watched"]) == (0, 0) and not watched
    run(time.time() - 400, 300)  # it should have ended 100 s ago, and no exit came: its process died
    assert reconcile.reconcile_node(node="n1", managed=[], starting=[], gone=[])["watched"] == 1
    assert watched[-1]["name"] == row.name and watched[-1]["handle"]["duration"] == 300
    run(time.time(), 300)
    monkeypatch.setattr(control, "_STARTED_AT", time.time() + 1)  # this controller started after it
    assert reconcile.reconcile_node(node="n1", managed=[], starting=[], gone=[])["watched"] == 1
    assert Workload.all_tenants.get(pk=job.pk).state == WorkloadState.RUNNING


def test_a_node_has_one_inventory_question_outstanding_at_most(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller that fell behind does not pile a question per node per period onto its own queue: a node
    is asked again once it answered (or once the question's wait is over, when its answer was lost)."""
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(dispatch, "send", lambda task, *, queue, kwargs: _record(sent, kwargs))
    _ready(world)
    assert reconcile.request_node_inventories() == 1
    assert reconcile.request_node_inventories() == 0, "its answer has not come yet"
    reconcile.reconcile_node(node="n1", managed=[], starting=[], gone=[], unstarted=[])
    assert reconcile.request_node_inventories() == 1
    monkeypatch.setattr(reconcile, "INVENTORY_ANSWER_WAIT_SECONDS", 1)
    reconcile.reconcile_node(node="n1", managed=[], starting=[], gone=[], unstarted=[])
    assert reconcile.request_node_inventories() == 1
    assert reconcile.request_node_inventories() == 0
    time.sleep(2.1)  # the answer was lost: asked again once the wait is over
    assert reconcile.request_node_inventories() == 1
    assert len(sent) == 4


def _record(into: list[dict[str, Any]], kwargs: dict[str, Any]) -> bool:
    """Stand in for `dispatch.send`: keep the message's arguments, report it sent."""
    into.append(kwargs)
    return True


def _with_agent(name: str) -> None:
    """Make node `name` one with an agent of its own (process runtime), whose answers cover the whole node."""
    Node.objects.filter(name=name).update(runtime=RuntimeKind.PROCESS)


def test_a_late_exit_report_still_completes_the_workload(world: World) -> None:
    """However late it arrives, an exit with 0 ends the workload Succeeded (nothing declared it vanished)."""
    _ready(world)
    job = _running(world)
    row = Replica.all_tenants.get(workload=job)
    reconcile.reconcile_node(node="n1", managed=[], gone=[])  # a stale list in between changes nothing
    assert replicas.record_replica_exited(workload_id=job.pk, attempt=row.attempt, replica=row.index, exit_code=0)
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (WorkloadState.SUCCEEDED, 0)


def test_a_launching_replica_the_node_does_not_have_is_started_again(world: World) -> None:
    _ready(world)
    job = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    run_pass()
    job.refresh_from_db()
    launch_workload(workload=job)
    row = Replica.all_tenants.get(workload=job)
    assert row.state == ReplicaState.LAUNCHING
    # The node is starting it right now: nothing to do.
    counts = reconcile.reconcile_node(node="n1", managed=[], starting=[row.name], gone=[])
    assert counts["restarted"] == 0 and counts["vanished"] == 0
    # The node neither has it nor is starting it (its start message was lost): it is sent again, never failed.
    counts = reconcile.reconcile_node(node="n1", managed=[], starting=[], gone=[row.name])
    assert counts["restarted"] == 1 and counts["vanished"] == 0
    # The runtime has it but never started it (the engine died between create and start): started again,
    # not merely watched, which would leave it "running" without ever running.
    created = [{"name": row.name, "workload_id": str(job.pk), "attempt": 1, "replica": 0, "state": "created"}]
    counts = reconcile.reconcile_node(node="n1", managed=created, starting=[], gone=[])
    assert (counts["restarted"], counts["watched"]) == (1, 0)
    job.refresh_from_db()
    assert job.state == WorkloadState.STARTING


def test_reconcile_launches_placements_whose_launch_never_happened(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A console restart loses the launch message of a placed workload: reconcile asks for its launch again,
    in the batched messages a pass sends (never inline: a backlog of thousands must not run inside reconcile)."""
    asked: list[list[int]] = []
    monkeypatch.setattr(dispatch, "launch_on_commit", lambda ids: asked.append(sorted(ids)))
    _ready(world)
    job = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    run_pass()
    job.refresh_from_db()
    assert job.state == WorkloadState.SCHEDULED
    asked.clear()
    assert reconcile.reconcile_ledger()["relaunched"] == 0, "too young: its launch may be on the way"
    assert reconcile.reconcile_ledger(now=timezone.now() + timedelta(seconds=30))["relaunched"] == 1
    assert asked[-1] == [job.pk]
    assert Workload.all_tenants.get(pk=job.pk).state == WorkloadState.SCHEDULED, "launched by the message, not here"
    assert execution.launch_workloads(workload_ids=asked[-1]) == 1
    assert Workload.all_tenants.get(pk=job.pk).state == WorkloadState.STARTING


def test_a_second_launch_message_sends_no_start_twice(world: World) -> None:
    """The pass's launch and reconcile's both reach the controller: only the first sends starts; a resend is
    reconcile's, for what the node said it is not starting."""
    _ready(world)
    job = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    run_pass()
    assert execution.launch_workloads(workload_ids=[job.pk]) == 1
    assert execution.launch_workloads(workload_ids=[job.pk]) == 0
    assert execution.launch_workloads(workload_ids=[job.pk], resend=True) == 1


def test_only_a_start_sent_before_the_question_is_sent_again(world: World) -> None:
    """The node answers about the replicas launched before it was asked (`unstarted`): a replica launched
    after the question (its start still queued behind it) is absent from the answer and is not sent again."""
    _ready(world)
    job = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    run_pass()
    launch_workload(workload=job)
    row = Replica.all_tenants.get(workload=job)
    counts = reconcile.reconcile_node(node="n1", managed=[], starting=[], gone=[], unstarted=[])
    assert counts["restarted"] == 0, "launched after the question: its start may still be on the way"
    counts = reconcile.reconcile_node(node="n1", managed=[], starting=[], gone=[], unstarted=[row.name])
    assert counts["restarted"] == 1


def test_the_inventory_question_names_what_was_launched_and_what_started(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(dispatch, "send", lambda task, *, queue, kwargs: _record(sent, kwargs))
    _ready(world)
    launching = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    running = _running(world)
    run_pass()
    launch_workload(workload=Workload.all_tenants.get(pk=launching.pk))
    assert reconcile.request_node_inventories() == 1
    names = dict(Replica.all_tenants.values_list("workload_id", "name"))
    assert sent[-1]["launched"] == [names[launching.pk]]
    assert sent[-1]["confirmed"] == [names[running.pk]]


def test_reconcile_rewatches_replicas_that_run_on_both_sides(world: World) -> None:
    _ready(world)
    job = _running(world)
    _with_agent("n1")
    row = Replica.all_tenants.get(workload=job)
    managed = [{"name": row.name, "workload_id": str(job.pk), "attempt": 1, "replica": 0, "state": "running"}]
    assert reconcile.reconcile_node(node="n1", managed=managed) == {
        "orphans": 0,
        "vanished": 0,
        "watched": 1,
        "restarted": 0,
    }
    job.refresh_from_db()
    assert job.state == WorkloadState.RUNNING


def test_restart_applies_the_count_limits_and_allowed_images_again(world: World) -> None:
    _ready(world)
    member = Actor(user=world.member_a)
    first = services.submit_workload(actor=member, project=world.project_a, data=request(world))
    services.cancel_workload(actor=member, workload=first)
    ProjectQuota.all_tenants.filter(project=world.project_a).update(max_pending_workloads=1)
    services.submit_workload(actor=member, project=world.project_a, data=request(world, name="second"))
    with pytest.raises(ValidationError) as refused:
        services.restart_workload(actor=member, workload=first)
    assert refused.value.error_dict["project"][0].code == "max_pending_workloads"
    ProjectQuota.all_tenants.filter(project=world.project_a).update(max_pending_workloads=None)
    AllowedImage.objects.create(pattern="registry.example.com/other/*")
    with pytest.raises(ValidationError) as refused:
        services.restart_workload(actor=member, workload=first)
    assert refused.value.error_dict["image"][0].code == "image_not_allowed"
    first.refresh_from_db()
    assert (first.state, first.attempt) == (WorkloadState.CANCELLED, 1), "nothing was written"


def test_gpus_held_by_placed_work_are_never_shown_free(world: World) -> None:
    """Scheduled but not started (a console restarted in between): its GPUs count as held on every page."""
    from inventory.selectors import pool_capacity
    from jobs.selectors import allocation_by_pool_and_tenant

    _ready(world)
    for name in ("one", "two", "three"):
        services.submit_workload(
            actor=Actor(user=world.member_a), project=world.project_a, data=request(world, name=name)
        )
    run_pass()
    held = Allocation.all_tenants.filter(released_at__isnull=True, gpu__isnull=False).count()
    assert held == 3 and Workload.all_tenants.filter(state=WorkloadState.SCHEDULED).count() == 3
    [models] = pool_capacity([world.pool.pk]).values()
    assert sum(m["total"] - m["free"] for m in models) == held
    rows = [r for r in allocation_by_pool_and_tenant() if r.tenant == world.tenant_a.slug]
    assert sum(r.in_use for r in rows) == held


def _lost_run(workload: Workload) -> None:
    """The agent reports replica 0 of the current attempt ended unobserved: its node's engine lost its run."""
    replicas.record_replica_exited(
        workload_id=workload.pk, attempt=workload.attempt, replica=0, exit_code=None, unobserved=True
    )


def test_a_run_the_engine_lost_requeues_the_job_as_a_new_attempt_until_its_limit(world: World) -> None:
    _ready(world)
    job = _running(world, requeue_limit=1)
    _lost_run(job)
    job.refresh_from_db()
    assert (job.state, job.attempt, job.reason_code) == (WorkloadState.PENDING, 2, ReasonCode.ENGINE_LOST_RUN)
    assert _held(job) == 0, "the lost attempt's GPUs are released"
    event = WorkloadEvent.all_tenants.get(workload=job, to_state=WorkloadState.PREEMPTED)
    assert "engine lost track of it: how it ended is not known; requeued (requeue 1 of 1)" in event.message
    _lost_run(job)  # a duplicate report of the old attempt changes nothing
    job.refresh_from_db()
    assert (job.state, job.attempt) == (WorkloadState.PENDING, 2)
    job = _running_again(job)
    _lost_run(job)
    job.refresh_from_db()
    assert (job.state, job.reason_code) == (WorkloadState.FAILED, ReasonCode.ENGINE_LOST_RUN)
    assert "all 1 requeues are used" in job.reason_message and _held(job) == 0


def test_a_notebook_whose_run_the_engine_lost_is_started_again(world: World) -> None:
    _ready(world)
    notebook = _running(world, kind=WorkloadKind.NOTEBOOK)
    _lost_run(notebook)
    notebook.refresh_from_db()
    assert (notebook.state, notebook.attempt) == (WorkloadState.PENDING, 2)
    assert notebook.reason_code == ReasonCode.ENGINE_LOST_RUN


def test_a_lost_run_of_one_gang_replica_stops_the_others_and_requeues_the_gang(world: World) -> None:
    _ready(world)
    gang = _running(world, replicas=2, gpus_per_replica=1)
    _lost_run(gang)
    gang.refresh_from_db()
    assert (gang.state, gang.attempt) == (WorkloadState.PREEMPTED, 1), "waits for replica 1 to stop"
    assert "The other replicas are stopped." in gang.reason_message
    replicas.record_replica_exited(workload_id=gang.pk, attempt=1, replica=1, exit_code=137, message="Stopped.")
    gang.refresh_from_db()
    assert (gang.state, gang.attempt, _held(gang)) == (WorkloadState.PENDING, 2, 0)
