"""The agent's pull reports: sent soon by a thread of their own, the latest per replica, before any other report.

A transport that records what it sends (and can be made slow or failing)
stands for the broker; the executor is the real one.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from common.protocol.messages import ReplicaStarted
from inventory.agent.executor import Executor
from inventory.agent.pulls import PULL_TASK, PullReports
from inventory.agent.replicas import ReplicaRef
from inventory.drivers import policy
from inventory.drivers.base import PullProgress
from tests.inventory.drivers.conftest import TEST_INSTALLATION
from tests.workers import wait_until

REF = ReplicaRef(
    node="n1",
    runtime="docker",
    name=policy.container_name(TEST_INSTALLATION, 7, 0, 1),
    workload_id=7,
    attempt=1,
    replica=0,
)
OTHER = ReplicaRef(
    node="n1",
    runtime="docker",
    name=policy.container_name(TEST_INSTALLATION, 8, 0, 1),
    workload_id=8,
    attempt=1,
    replica=0,
)


def _at(seconds: float, *, done: bool = False) -> PullProgress:
    return PullProgress(
        image="127.0.0.1:5000/lab:1",
        began_at=1000.0,
        seconds=seconds,
        layers_done=1,
        layers_total=2,
        bytes_done=int(seconds * 1000),
        bytes_total=4000,
        done=done,
    )


class Broker:
    """Records each send as (task, kwargs); a send of a pull report waits while `gate` is clear."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.failures = 0
        self.lock = threading.Lock()

    def __call__(self, task: str, **kwargs: Any) -> None:
        if task == PULL_TASK:
            self.gate.wait(10)
            if self.failures:
                self.failures -= 1
                raise ConnectionError("broker restarting")
        with self.lock:
            self.sent.append((task, kwargs))

    def seconds(self) -> list[tuple[int, float]]:
        return [(kwargs["workload_id"], kwargs["seconds"]) for task, kwargs in self.sent if task == PULL_TASK]


def test_a_report_leaves_by_itself_with_the_replica_and_the_whole_progress() -> None:
    broker = Broker()
    PullReports(broker).listener(REF)(_at(1.0))
    assert wait_until(lambda: broker.sent, timeout=5)
    assert broker.sent == [
        (
            PULL_TASK,
            {
                "workload_id": 7,
                "attempt": 1,
                "replica": 0,
                "image": "127.0.0.1:5000/lab:1",
                "began_at": 1000.0,
                "seconds": 1.0,
                "layers_done": 1,
                "layers_total": 2,
                "bytes_done": 1000,
                "bytes_total": 4000,
                "done": False,
            },
        )
    ]


def test_while_the_broker_is_slow_the_pull_never_waits_and_only_each_replicas_latest_report_is_sent() -> None:
    broker = Broker()
    reports = PullReports(broker)
    broker.gate.clear()
    reports.put(REF, _at(0.0))
    assert wait_until(lambda: not reports._pending, timeout=5), "the first is being sent"
    for seconds in (1.0, 2.0, 3.0):
        reports.put(REF, _at(seconds))  # returns at once although the broker holds the first send
    reports.put(OTHER, _at(0.5))
    broker.gate.set()
    assert wait_until(lambda: len(broker.sent) == 3, timeout=5), broker.sent
    assert broker.seconds() == [(7, 0.0), (7, 3.0), (8, 0.5)]


def test_another_report_of_the_executor_leaves_after_the_pull_reports_waiting_before_it() -> None:
    broker = Broker()
    executor = Executor(send=broker)
    broker.gate.clear()
    executor.pulls.put(REF, _at(0.0))
    assert wait_until(lambda: not executor.pulls._pending, timeout=5)
    executor.pulls.put(REF, _at(2.0, done=True))
    started = threading.Thread(target=executor.report, args=(ReplicaStarted(**REF.ids(), handle={}),))
    started.start()
    broker.gate.set()
    started.join(10)
    assert [task for task, _ in broker.sent] == [PULL_TASK, PULL_TASK, "jobs.replica_started"]
    assert broker.seconds() == [(7, 0.0), (7, 2.0)]


def test_a_report_the_broker_refused_is_dropped_and_the_next_one_goes(caplog: pytest.LogCaptureFixture) -> None:
    broker = Broker()
    broker.failures = 1
    reports = PullReports(broker)
    reports.put(REF, _at(0.0))
    assert wait_until(lambda: "could not be sent" in caplog.text, timeout=5)
    reports.put(REF, _at(1.0))
    assert wait_until(lambda: broker.sent, timeout=5)
    assert broker.seconds() == [(7, 1.0)]
