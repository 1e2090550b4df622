"""When the platform stops a workload, its owner is told why, never only an exit code.

Every platform stop (time limit, cancel by a user or an operator, idle or
quota hibernation, preemption, a superseded attempt's late start) records
its reason on the workload (what the API and page show) and on each replica
it stops; the replica's exit, usually 137 or 143 (the signal the stop sent),
then reads as that reason. A replica killed while its workload runs was not
killed by the platform, and says so.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import ReasonCode, WorkloadState
from jobs.models import Replica, Workload, WorkloadEvent
from jobs.services import actions, replicas, watchdog
from jobs.services.stopping import stop_workload
from tenants.context import Actor
from tests.conftest import World
from tests.jobs.test_watchdog import _ready, _running

pytestmark = pytest.mark.django_db


def _killed(job: Workload, code: int = 137) -> Replica:
    """Play the node's report: the replica ended with `code` ("Stopped." is what an agent says after a stop)."""
    replicas.record_replica_exited(
        workload_id=job.pk, attempt=job.attempt, replica=0, exit_code=code, message="Stopped."
    )
    return Replica.all_tenants.get(workload=job, attempt=job.attempt, index=0)


def test_a_time_limit_stop_shows_its_reason_on_the_workload_and_the_killed_replica(world: World) -> None:
    _ready(world)
    job = _running(world, max_runtime_seconds=60)
    watchdog.enforce_time_limits(now=timezone.now() + timedelta(seconds=61))
    row = _killed(job)
    job.refresh_from_db()
    assert job.reason_code == ReasonCode.MAX_RUNTIME and "maximum runtime" in job.reason_message
    assert row.exit_code == 137
    assert row.message.startswith("Stopped by the platform: Stopped: it reached its maximum runtime")
    assert row.message.endswith("It exited with code 137 once stopped.")


def test_an_operators_stop_names_the_operator_on_the_replica(world: World) -> None:
    _ready(world)
    job = _running(world)
    actions.cancel_workload(actor=Actor(user=world.operator), workload=job)
    row = _killed(job, 143)
    assert f"Stopped by {Actor(user=world.operator).label}" in row.message
    assert Workload.all_tenants.get(pk=job.pk).state == WorkloadState.CANCELLED


@pytest.mark.parametrize(
    ("to_state", "reason_code", "message"),
    [
        (WorkloadState.HIBERNATED, ReasonCode.IDLE, "Hibernated after 1h idle."),
        (WorkloadState.PREEMPTED, ReasonCode.ACCESS_REVOKED, "Stopped: the project's budget is spent."),
        (WorkloadState.FAILED, ReasonCode.NODE_LOST, "Node n1 was lost."),
    ],
)
def test_every_stop_through_the_ledger_reaches_the_replicas_exit(
    world: World, to_state: WorkloadState, reason_code: str, message: str
) -> None:
    _ready(world)
    job = _running(world)
    assert stop_workload(workload_id=job.pk, to_state=to_state, reason_code=reason_code, message=message)
    row = _killed(job)
    assert row.message == f"Stopped by the platform: {message} It exited with code 137 once stopped."
    # The workload's events keep the reason too (a requeued job's status moves on to "Requeued: ...").
    assert message in WorkloadEvent.all_tenants.filter(workload=job).values_list("message", flat=True)


def test_a_late_start_of_a_stopped_attempt_is_stopped_with_the_reason(world: World) -> None:
    _ready(world)
    job = _running(world)
    stop_workload(workload_id=job.pk, to_state=WorkloadState.FAILED, reason_code=ReasonCode.MAX_RUNTIME, message="X.")
    Replica.all_tenants.filter(workload=job).update(state="launching", message="")
    assert not replicas.record_replica_started(workload_id=job.pk, attempt=1, replica=0, handle={"name": "r"})
    assert _killed(job).message.startswith("Stopped by the platform: X.")


def test_a_replica_killed_while_its_workload_runs_says_the_platform_did_not_stop_it(world: World) -> None:
    _ready(world)
    job = _running(world)
    replicas.record_replica_exited(
        workload_id=job.pk, attempt=1, replica=0, exit_code=137, message="killed: out of memory"
    )
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (WorkloadState.FAILED, 137)
    assert "killed: out of memory" in job.reason_message
    assert "a signal this console did not send" in job.reason_message
