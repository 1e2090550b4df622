"""The agent's log outbox: a node's batches leave together, in order, before any other report."""

from __future__ import annotations

import threading
import time
from typing import Any

from common.protocol.messages import LogBatches, ReplicaExited
from inventory.agent.executor import SHIP_SECONDS, Executor, LogOutbox
from tests.workers import wait_until


class Recorder:
    """A transport that records what was sent; it can be told to fail."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.failures = 0
        self.lock = threading.Lock()

    def __call__(self, task: str, **kwargs: Any) -> None:
        with self.lock:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("broker unreachable")
            self.sent.append((task, kwargs))

    def batches(self) -> list[dict[str, Any]]:
        with self.lock:
            messages = [kwargs["batches"] for task, kwargs in self.sent if task == LogBatches.TASK]
        return [batch for message in messages for batch in message]


def _batch(replica: int, n: int) -> dict[str, Any]:
    return {"workload_id": 7, "attempt": 1, "replica": replica, "since": f"c{n}", "cursor": f"c{n + 1}", "lines": []}


def test_a_quiet_nodes_batch_leaves_at_once() -> None:
    send = Recorder()
    outbox = LogOutbox(send)
    started = time.monotonic()
    outbox.put(_batch(0, 0))
    assert wait_until(lambda: len(send.batches()) == 1, timeout=5, interval=0.005)
    assert time.monotonic() - started < SHIP_SECONDS, "no added wait when nothing else is going on"


def test_a_busy_nodes_batches_leave_together_in_order() -> None:
    send = Recorder()
    outbox = LogOutbox(send)

    def replica(index: int) -> None:
        for n in range(40):
            outbox.put(_batch(index, n))
            time.sleep(0.005)

    threads = [threading.Thread(target=replica, args=(index,)) for index in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wait_until(lambda: len(send.batches()) == 400)
    assert len(send.sent) < 400 / 10, "many replicas' batches share a message"
    for index in range(10):
        assert [b["since"] for b in send.batches() if b["replica"] == index] == [f"c{n}" for n in range(40)]


def test_other_reports_go_after_the_output_before_them() -> None:
    send = Recorder()
    executor = Executor(send=send)
    for n in range(3):
        executor.outbox.put(_batch(0, n))
    executor.report(ReplicaExited(workload_id=7, attempt=1, replica=0, exit_code=0))
    tasks = [task for task, _ in send.sent]
    assert tasks[-1] == ReplicaExited.TASK
    assert len(send.batches()) == 3, "every batch was sent before the exit"


def test_a_failed_send_keeps_the_batches_for_the_next_one() -> None:
    send = Recorder()
    send.failures = 1
    outbox = LogOutbox(send)
    outbox.put(_batch(0, 0))
    time.sleep(SHIP_SECONDS * 3)
    assert send.batches() == []
    outbox.put(_batch(0, 1))
    assert wait_until(lambda: [b["since"] for b in send.batches()] == ["c0", "c1"])
