"""Coalescing control work (common.control): however often it is asked for, at most one run waits.

The worker is real (in-process transport, or Redis when REDIS_URL is set);
the task under test sleeps so that requests pile up while it runs, as they
do on a starved machine.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import shared_task

from common import control
from common.protocol.messages import ListReplicas, LogBatches, ReplicaExited
from tests.workers import running_worker, wait_until

RUNS: list[float] = []
_BUSY = threading.Event()


@shared_task(name="tests.slow_control_pass", base=control.CoalescingTask, ignore_result=True)
def slow_control_pass() -> None:
    """A stand-in for a scheduling pass that takes 0.3 s (a real pass does the same work whatever the backlog)."""
    _BUSY.set()
    RUNS.append(time.monotonic())
    time.sleep(0.3)
    _BUSY.clear()


NAME = "tests.slow_control_pass"


@pytest.fixture
def clean() -> Iterator[None]:
    RUNS.clear()
    control._release(NAME)
    yield
    control._release(NAME)


def test_a_request_merges_into_the_message_already_waiting(clean: None, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    monkeypatch.setattr(control.app, "send_task", lambda name, **kwargs: sent.append(name))
    assert control.request(NAME) is True
    assert [control.request(NAME) for _ in range(50)] == [False] * 50
    assert sent == [NAME] and control.queued(NAME)


def test_a_failed_send_clears_the_marker_so_the_next_request_tries_again(
    clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(name: str, **kwargs: Any) -> None:
        raise OSError("broker down")

    monkeypatch.setattr(control.app, "send_task", refuse)
    with pytest.raises(OSError, match="broker down"):
        control.request(NAME)
    assert not control.queued(NAME)


def test_without_a_cache_requests_are_sent_rather_than_lost(clean: None, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    monkeypatch.setattr(control.app, "send_task", lambda name, **kwargs: sent.append(name))

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("cache down")

    from django.core.cache import caches

    monkeypatch.setattr(type(caches["default"]), "add", broken)
    assert control.request(NAME) and control.request(NAME)
    assert sent == [NAME, NAME]


def test_ingest_tasks_travel_on_their_own_queue() -> None:
    assert control.queue_for(LogBatches.TASK) == control.INGEST_QUEUE
    assert control.queue_for(ReplicaExited.TASK) == control.CONTROL_QUEUE


JUDGED: list[tuple[float, float]] = []


@shared_task(name="tests.judge_as_of_evidence", ignore_result=True)
def judge_as_of_evidence() -> None:
    """A stand-in for a judging task (start timeouts, lost nodes): it records its evidence moment and now."""
    JUDGED.append((control.evidence_time().timestamp(), time.time()))


@shared_task(name="tests.hold_control", ignore_result=True)
def hold_control(seconds: float) -> None:
    """A backlog: the one worker thread is busy for `seconds`."""
    time.sleep(seconds)


def test_outside_a_task_the_evidence_is_complete_now() -> None:
    assert abs(control.evidence_time().timestamp() - time.time()) < 1


@pytest.mark.django_db(transaction=True)
def test_a_task_that_waited_in_the_queue_judges_as_of_when_it_was_sent() -> None:
    """A judging message that waited behind a backlog (here: 2 s of other work on the one worker thread) sees
    every report sent before it: it judges the moment it was sent, not the moment it ran."""
    JUDGED.clear()
    with running_worker(["control"], concurrency=1):
        hold_control.apply_async(kwargs={"seconds": 2.0}, queue="control")
        sent = time.time()
        judge_as_of_evidence.apply_async(queue="control")
        assert wait_until(lambda: JUDGED, timeout=15)
    evidence, ran = JUDGED[0]
    assert ran - sent >= 2
    assert sent - 0.5 <= evidence <= sent + 0.5, (evidence - sent, ran - sent)


@pytest.mark.django_db(transaction=True)
def test_a_flood_of_requests_keeps_at_most_one_waiting_and_loses_none(clean: None) -> None:
    """200 requests over about 2 s to a task that takes 0.3 s: the queue never holds more than one message,
    and a request made while a run is under way gets one more run after it."""
    depths: list[int] = []
    began = time.monotonic()
    with running_worker(["control"], concurrency=2):
        for _ in range(200):
            slow_control_pass.apply_async()  # what beat and `control.request` both do
            depths.append(control.queue_depths(("control",))["control"])
            time.sleep(0.01)
        assert max(depths) <= 1, depths
        control.request(NAME)
        assert wait_until(lambda: _BUSY.is_set(), timeout=5)
        asked = time.monotonic()
        control.request(NAME)  # made during a run: must not be swallowed by it
        assert wait_until(lambda: any(run > asked for run in RUNS), timeout=10), "the follow-up run never came"
    # At most one waiting: each of the two threads runs back to back at worst, never once per request.
    most = 2 * (time.monotonic() - began) / 0.3 + 2
    assert 2 <= len(RUNS) <= most, f"{len(RUNS)} runs for 201 requests (at most {most:.0f})"


@pytest.mark.django_db(transaction=True)
def test_a_report_that_meets_the_database_down_is_retried_not_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Postgres restarting while an exit report is applied: the report is applied once it is back."""
    from django.db import OperationalError

    from jobs import tasks

    calls: list[dict[str, Any]] = []

    def flaky(**kwargs: Any) -> bool:
        calls.append(kwargs)
        if len(calls) == 1:
            raise OperationalError("the database system is starting up")
        return True

    monkeypatch.setattr(tasks.replicas, "record_replica_exited", flaky)
    with running_worker(["control"], concurrency=1):
        tasks.replica_exited.apply_async(kwargs={"workload_id": 1, "attempt": 1, "replica": 0, "exit_code": 0})
        assert wait_until(lambda: len(calls) >= 2, timeout=15), "the report was dropped after one failure"
    assert calls[1]["exit_code"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_starting_worker_forgets_messages_a_killed_one_held(clean: None) -> None:
    """A worker killed -9 with a pass waiting leaves its marker set; the next worker to start clears it, so
    the restarted controller's first request is sent instead of merging into a message the broker holds."""
    control._claim(NAME)  # what the killed worker's waiting message left behind
    assert control.queued(NAME)
    with running_worker(["control"], concurrency=1):
        assert not control.queued(NAME)
        assert control.request(NAME)
        assert wait_until(lambda: len(RUNS) >= 1, timeout=10)


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_messages_a_killed_worker_held_are_restored_when_a_worker_starts(clean: None) -> None:
    """kill -9 of a worker holding a message leaves it unacknowledged in Redis (for an hour, by default);
    the next controller worker to start puts it back on its queue and runs it."""
    from tests.workers import purge

    agent_queue = "node.restore-test"
    purge(["control", agent_queue])
    slow_control_pass.apply_async()
    control.app.send_task(ListReplicas.TASK, kwargs={"node": "x", "runtime": "process"}, queue=agent_queue)
    connection: Any = control.app.connection_for_write()
    channel: Any = connection.default_channel
    taken = channel.basic_get("control", no_ack=False)  # a worker took it...
    held = channel.basic_get(agent_queue, no_ack=False)  # (and a live agent holds one of its own)
    assert taken is not None and held is not None
    connection._connection = None  # ...and died: nothing is acknowledged or given back
    try:
        with running_worker(["control"], concurrency=1):
            assert wait_until(lambda: len(RUNS) >= 1, timeout=10), "the held message was never restored"
            with control.app.connection_for_write() as check:
                redis_channel: Any = check.default_channel  # kombu's Redis channel: typed as a plain channel
                client = redis_channel.client
                assert client.llen(agent_queue) == 0, "an agent's message in hand is not the controller's to give back"
                held_now = [json.loads(value)[2] for value in client.hvals(redis_channel.unacked_key)]
                assert agent_queue in held_now, "it stays with the agent that holds it"
    finally:
        with control.app.connection_for_write() as cleanup:
            leftover: Any = cleanup.default_channel
            leftover.client.delete(leftover.unacked_key)
            leftover.client.delete(leftover.unacked_index_key)
        purge([agent_queue])
