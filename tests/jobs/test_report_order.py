"""A short job's exit report may be applied before its start report (two workers take them at once).

The exit proves the replica started: the workload still passes through
running, with its start time, and the late start report stops nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from jobs import dispatch
from jobs.choices import WorkloadState
from jobs.models import Replica, ReplicaState, Workload, WorkloadEvent
from jobs.services import replicas
from tests.conftest import World
from tests.jobs.factories import add_node, add_replica

pytestmark = pytest.mark.django_db


def _starting(world: World) -> Replica:
    return add_replica(world, add_node(world, "order-node"), state=WorkloadState.STARTING, name="short")


def test_an_exit_before_the_start_report_still_runs_the_workload_and_the_late_start_stops_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = _starting(world)
    sent: list[Any] = []
    monkeypatch.setattr(dispatch, "send_on_commit", lambda task, **kwargs: sent.append(task))

    assert replicas.record_replica_exited(workload_id=row.workload_id, attempt=1, replica=0, exit_code=0)
    workload = Workload.all_tenants.get(pk=row.workload_id)
    assert workload.state == WorkloadState.SUCCEEDED
    assert workload.started_at is not None
    path = list(WorkloadEvent.all_tenants.filter(workload_id=workload.pk).values_list("to_state", flat=True))
    assert path[-2:] == ["running", "succeeded"]

    late = replicas.record_replica_started(
        workload_id=row.workload_id, attempt=1, replica=0, handle={"id": "c1"}, endpoint="127.0.0.1:1"
    )
    assert late is False and sent == [], "nothing runs: no stop is sent"
    row.refresh_from_db()
    assert row.state == ReplicaState.EXITED and row.started_at is not None and row.handle == {"id": "c1"}


def test_a_launch_failure_before_any_start_is_not_counted_as_a_run(world: World) -> None:
    row = _starting(world)
    replicas.record_replica_exited(
        workload_id=row.workload_id, attempt=1, replica=0, exit_code=None, message="no image", launch_failed=True
    )
    row.refresh_from_db()
    assert row.started_at is None
    assert Workload.all_tenants.get(pk=row.workload_id).started_at is None
