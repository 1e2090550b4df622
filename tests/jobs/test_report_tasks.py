"""The controller's report tasks decode their protocol message before acting, and refuse one that does not fit.

Reports reach these tasks over Celery from a co-located agent and through
the HTTPS gateway from a joined host; either way the message names the
version of its shape in a header (`common.control.VERSION_HEADER`), which
the task checks as it checks the fields.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import current_app as app
from celery.signals import before_task_publish

from common.control import VERSION_HEADER
from common.protocol import ProtocolError
from common.protocol.messages import ReplicaExited, ReplicaStarted
from inventory.models import Node
from jobs import tasks
from jobs.models import Replica, ReplicaState
from jobs.services import agent_gateway
from tests.conftest import World, actor
from tests.inventory.factories import make_node
from tests.jobs.factories import add_replica
from tests.workers import purge, running_worker, wait_until

pytestmark = pytest.mark.django_db


def _node(world: World) -> Node:
    return make_node(actor(world.operator), world.pool, name="gpu-1", runtime="docker")


def _started(row: Replica, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"workload_id": row.workload_id, "attempt": 1, "replica": 0, "handle": {"id": "c1"}, **(changes or {})}


def _untouched(replica: Replica) -> bool:
    replica.refresh_from_db()
    return replica.state == ReplicaState.LAUNCHING and not replica.handle


@pytest.mark.parametrize(
    "changes",
    [
        {"attempt": "1"},  # a wrong type
        {"attempt": True},  # a boolean is no integer
        {"replica": -1},  # out of range
        {"handle": ["c1"]},  # not an object
        {"container": "c1"},  # a field the message does not have
    ],
    ids=["string", "boolean", "range", "handle", "extra"],
)
def test_a_start_report_that_does_not_fit_its_message_is_refused_and_changes_nothing(
    world: World, changes: dict[str, Any]
) -> None:
    replica = add_replica(world, _node(world))
    with pytest.raises(ProtocolError):
        tasks.replica_started(**_started(replica, changes))
    assert _untouched(replica)


def test_a_report_missing_a_field_is_refused(world: World) -> None:
    replica = add_replica(world, _node(world))
    with pytest.raises(ProtocolError) as refused:
        tasks.replica_exited(workload_id=replica.workload_id, attempt=1, replica=0)
    assert refused.value.problems == {"exit_code": "is missing"}
    assert _untouched(replica)


def test_a_nodes_view_with_a_malformed_replica_is_refused_whole(world: World) -> None:
    node = _node(world)
    replica = add_replica(world, node)
    managed = {"name": replica.name, "workload_id": str(replica.workload_id), "attempt": 1, "replica": 0}
    with pytest.raises(ProtocolError) as refused:
        tasks.node_replicas(node=node.name, managed=[{**managed, "state": "sleeping", "handle": {}}])
    assert set(refused.value.problems) == {"managed[0].state"}
    assert _untouched(replica)


def test_a_report_that_fits_is_acted_on(world: World) -> None:
    replica = add_replica(world, _node(world))
    assert tasks.replica_started(**_started(replica)) is True
    replica.refresh_from_db()
    assert replica.state == ReplicaState.RUNNING and replica.handle == {"id": "c1"}


@pytest.mark.django_db(transaction=True)
def test_through_the_worker_a_report_of_another_version_is_refused_and_the_current_one_is_taken(
    world: World,
) -> None:
    """The publisher stamps its version (`stamp_protocol_version`); one the controller does not read is refused."""
    node = _node(world)
    older, current = add_replica(world, node, name="older"), add_replica(world, node, name="current")
    with running_worker(["control"], concurrency=1):  # one at a time: the refused one runs first
        app.send_task(
            ReplicaStarted.TASK,
            kwargs=_started(older),
            queue="control",
            headers={VERSION_HEADER: ReplicaStarted.VERSION + 1},
        )
        app.send_task(ReplicaStarted.TASK, kwargs=_started(current), queue="control")
        assert wait_until(lambda: Replica.all_tenants.get(pk=current.pk).state == ReplicaState.RUNNING, timeout=10)
    assert _untouched(older)


@pytest.mark.django_db(transaction=True)
def test_through_the_worker_a_report_with_a_field_of_the_wrong_type_is_refused(world: World) -> None:
    node = _node(world)
    bad, good = add_replica(world, node, name="bad"), add_replica(world, node, name="good")
    exited = {"attempt": 1, "replica": 0, "exit_code": 0}
    with running_worker(["control"], concurrency=1):
        refused = {**exited, "workload_id": bad.workload_id, "exit_code": "0"}
        app.send_task(ReplicaExited.TASK, kwargs=refused, queue="control")
        app.send_task(ReplicaExited.TASK, kwargs={**exited, "workload_id": good.workload_id}, queue="control")
        assert wait_until(lambda: Replica.all_tenants.get(pk=good.pk).state == ReplicaState.EXITED, timeout=10)
    assert _untouched(bad)


@pytest.mark.parametrize(
    ("named", "header"), [(ReplicaStarted.VERSION + 1, ReplicaStarted.VERSION + 1), (None, ReplicaStarted.VERSION)]
)
def test_the_gateway_hands_a_report_on_with_the_version_its_host_named(
    world: World, named: int | None, header: int
) -> None:
    """The envelope's `version` becomes the Celery header the task checks (a controller running other code than
    the web process that checked the batch still refuses what it does not read); a report that names none is
    stamped with the version the console writes, as any publisher's is."""
    node = _node(world)
    replica = add_replica(world, node)
    published: list[Any] = []

    def record(sender: str | None = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
        if sender == ReplicaStarted.TASK:
            published.append((headers or {}).get(VERSION_HEADER))

    envelope: dict[str, Any] = {"kind": "task", "task": ReplicaStarted.TASK, "kwargs": _started(replica)}
    if named is not None:
        envelope["version"] = named
    before_task_publish.connect(record, weak=False, dispatch_uid="test.report_version")
    try:
        assert agent_gateway.deliver_messages(node, [envelope]) == 1
    finally:
        before_task_publish.disconnect(dispatch_uid="test.report_version")
    purge(["control"])
    assert published == [header]
