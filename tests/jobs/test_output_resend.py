"""A log batch lost on the way is read again from the stored cursor: the stored log ends complete, in order, once.

The agent is real (`Executor` on the process runtime, a real child process
printing its lines); its reports reach the real controller services, except
that the transport loses one log batch, as Redis's does for the message a
worker was taking when it was killed.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from common.protocol.messages import LogBatches, ReplicaExited, ReplicaSpec, ReplicaStarted, StopReplica, WatchReplica
from inventory.agent.config import AgentConfig
from inventory.agent.executor import Executor
from inventory.models import Node
from inventory.services.installation import installation_id
from jobs import dispatch, tasks
from jobs.choices import WorkloadState
from jobs.models import LogChunk, Replica, Workload
from jobs.services import reconcile
from jobs.services.execution import container_name
from jobs.services.logs import aligned, ingest_log_batches
from tests.conftest import World
from tests.jobs.factories import add_node
from tests.process_user import workload_python
from tests.workers import wait_until

pytestmark = pytest.mark.django_db

NODE = "resend-local"
LINES = 40


def _workload(world: World) -> tuple[Workload, Replica]:
    node = add_node(world, NODE)
    Node.objects.filter(pk=node.pk).update(runtime="process")
    workload = Workload.all_tenants.create(
        tenant_id=world.project_a.tenant_id,
        project=world.project_a,
        owner=world.member_a,
        name="printer",
        image="local",
        pool=world.pool,
        state=WorkloadState.RUNNING,
    )
    replica = Replica.all_tenants.create(
        tenant_id=workload.tenant_id,
        workload=workload,
        attempt=1,
        index=0,
        node=node,
        name=container_name(workload.pk, 0, 1),
    )
    return workload, replica


def _spec(workload: Workload, replica: Replica) -> ReplicaSpec:
    # Lines spread over about a second, so they leave in several batches.
    program = f"import time\nfor i in range({LINES}):\n    print('line', i, flush=True)\n    time.sleep(0.03)\n"
    return ReplicaSpec(
        node=NODE,
        runtime="process",
        name=replica.name,
        workload_id=workload.pk,
        tenant="alpha",
        attempt=1,
        replica=0,
        image="local",
        command=[*workload_python(), "-c", program],
    )


class LossyTransport:
    """The agent's reports, applied by the controller's own tasks; the `lose`-th log message never arrives."""

    def __init__(self, lose: int) -> None:
        self.lose = lose
        self.log_messages = 0
        self.lost: list[dict[str, Any]] = []
        self.exits = 0

    def __call__(self, task: str, **kwargs: Any) -> None:
        if task == LogBatches.TASK:
            self.log_messages += 1
            if self.log_messages == self.lose:
                self.lost.extend(kwargs["batches"])
                return
            ingest_log_batches(kwargs["batches"], wait_seconds=0)
        elif task == ReplicaStarted.TASK:
            tasks.replica_started(**kwargs)
        elif task == ReplicaExited.TASK:
            self.exits += 1
            tasks.replica_exited(**kwargs)


def _recorder(sent: list[tuple[str, dict[str, Any]]]) -> Any:
    """A `dispatch.send` that keeps what the controller sends its nodes."""

    def send(task: str, *, queue: str, kwargs: dict[str, Any]) -> bool:
        sent.append((task, kwargs))
        return True

    return send


def _stored_texts(workload: Workload) -> list[str]:
    chunks = LogChunk.all_tenants.filter(workload=workload).order_by("first_seq")
    return [line[3] for chunk in chunks for line in chunk.lines]


@pytest.mark.django_db(transaction=True)
def test_a_lost_batch_is_read_again_and_the_ended_replica_kept_until_its_log_is_complete(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workload, replica = _workload(world)
    transport = LossyTransport(lose=2)
    agent = Executor(AgentConfig(node=NODE, work_dir=tmp_path, process_enabled=True, probe="simulated"), send=transport)
    to_node: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(dispatch, "send", _recorder(to_node))

    agent.start(_spec(workload, replica))
    assert wait_until(lambda: Replica.all_tenants.get(pk=replica.pk).state == "exited", timeout=20)
    row = Replica.all_tenants.get(pk=replica.pk)
    assert transport.lost, "the transport lost a log message"
    assert row.log_end and row.log_cursor != row.log_end, "the exit report says where the output ends"
    assert len(_stored_texts(workload)) < LINES

    # Reconcile while the output is short: the ended replica's process directory is kept, not removed.
    item = {
        "name": replica.name,
        "state": "exited",
        "handle": row.handle,
        "installation": installation_id(),
        "node": NODE,
    }
    reconcile.reconcile_node(node=NODE, managed=[item])
    assert not [task for task, _ in to_node if task == StopReplica.TASK]

    counts = reconcile.reconcile_ledger(now=timezone.now() + reconcile.LOG_RESEND_AFTER + timedelta(seconds=1))
    assert counts["output_resent"] == 1
    message = next(m for t, m in to_node if t == WatchReplica.TASK)
    assert message["resend"] is True and message["log_cursor"] == row.log_cursor
    agent.watch(WatchReplica.from_wire(message))  # the node receives it
    want = [f"line {i}" for i in range(LINES)]
    assert wait_until(lambda: _stored_texts(workload) == want, timeout=20), _stored_texts(workload)
    row = Replica.all_tenants.get(pk=replica.pk)
    assert row.log_cursor == row.log_end

    # Complete now: its leftovers go, and nothing is read again.
    reconcile.reconcile_node(node=NODE, managed=[item])
    assert [task for task, _ in to_node].count(StopReplica.TASK) == 1
    stop = next(m for t, m in to_node if t == StopReplica.TASK)
    assert stop["ended"] is True and stop["remove"] is True
    exits = transport.exits
    agent.stop(
        StopReplica.from_wire(stop)
    )  # the node receives it: the leftovers go, and no second exit report comes back
    assert replica.name not in [m["name"] for m in agent.inventory(node=NODE, runtime="process")]
    assert transport.exits == exits
    later = reconcile.reconcile_ledger(now=timezone.now() + reconcile.LOG_RESEND_SECONDS * timedelta(seconds=1))
    assert later["output_resent"] == 0


def test_a_batch_waiting_a_second_time_asks_the_node_to_read_its_output_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    workload, replica = _workload(world)
    Replica.all_tenants.filter(pk=replica.pk).update(state="running", handle={"pid": 1}, log_cursor="c1")
    to_node: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(dispatch, "send", _recorder(to_node))
    monkeypatch.setattr(tasks.logs, "ingest_log_batches", lambda batches, wait_seconds: list(batches))
    monkeypatch.setattr(tasks.ingest_log_batches, "apply_async", lambda **kwargs: None)
    early = {"workload_id": workload.pk, "attempt": 1, "replica": 0, "since": "c2", "cursor": "c3", "lines": []}

    tasks.ingest_log_batches(batches=[early])  # the first wait: its predecessor is probably just late
    assert to_node == []
    tasks.ingest_log_batches(batches=[{**early, "retries": 1}])
    assert [(task, kwargs["resend"], kwargs["log_cursor"]) for task, kwargs in to_node] == [
        (WatchReplica.TASK, True, "c1")
    ]
    tasks.ingest_log_batches(batches=[{**early, "retries": 2}])
    assert len(to_node) == 1, "asked once per LOG_RESEND_SECONDS, however often the gap is seen"


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ("c0", ("c0", ["a", "b", "c"])),  # starts at the stored cursor: whole
        ("c1", ("c1", ["b", "c"])),  # overlaps it: from the line after it
        ("c3", ("c3", [])),  # ends at it: stored already, nothing left
        ("c9", None),  # starts further on: waits for its predecessor
    ],
)
def test_a_batch_is_cut_to_continue_the_stored_chain(stored: str, expected: tuple[str, list[str]] | None) -> None:
    batch = {"since": "c0", "cursor": "c3", "lines": ["a", "b", "c"], "marks": ["c1", "c2", "c3"]}
    cut = aligned(batch, stored)
    if expected is None:
        assert cut is None
    else:
        assert cut is not None and (cut["since"], cut["lines"]) == expected
