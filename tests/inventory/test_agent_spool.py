"""The remote agent's spool: order, its byte bound and what it drops first, a crash, live samples kept off disk."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from inventory.agent.remote.spool import LiveSamples, Spool, SpoolLocked

ROOT = Path(__file__).resolve().parents[2]


def _task(number: int, padding: int = 0) -> dict[str, Any]:
    return {"kind": "task", "task": "jobs.ingest_log_batches", "kwargs": {"n": number, "pad": "x" * padding}}


def _heartbeat(number: int, padding: int = 0) -> dict[str, Any]:
    return {"kind": "heartbeat", "report": {"n": number, "pad": "x" * padding}}


def _numbers(spool: Spool) -> list[tuple[str, int]]:
    items = spool.head(max_messages=10_000, max_bytes=1 << 40)
    return [(item.message["kind"], (item.message.get("kwargs") or item.message["report"])["n"]) for item in items]


@pytest.fixture
def spool(tmp_path: Path) -> Any:
    opened = Spool(tmp_path / "spool.sqlite3")
    yield opened
    opened.close()


def test_the_spool_is_a_fifo_read_in_batches_bounded_by_count_and_bytes(spool: Spool) -> None:
    for number in range(1200):
        spool.put(_task(number))
    first = spool.head()
    assert [item.message["kwargs"]["n"] for item in first] == list(range(500))
    spool.delete_through(first[-1].id)
    assert len(spool) == 700 and spool.head()[0].message["kwargs"]["n"] == 500
    by_bytes = spool.head(max_bytes=3 * spool.head()[0].size)
    assert len(by_bytes) == 3, "a batch stops before the byte bound"
    assert len(spool.head(max_bytes=1)) == 1, "a message larger than the byte bound still leaves alone"
    spool.put(_heartbeat(9999))
    assert _numbers(spool)[-1] == ("heartbeat", 9999), "kinds share one order"


def test_the_spool_counts_its_bytes_across_deletes_and_reopening(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite3")
    for number in range(10):
        spool.put(_task(number, padding=100))
    size = spool.bytes
    spool.delete_through(spool.head(max_messages=4)[-1].id)
    assert spool.bytes == size * 6 // 10
    spool.close()
    reopened = Spool(tmp_path / "s.sqlite3")
    assert reopened.bytes == size * 6 // 10 and len(reopened) == 6
    reopened.close()


def test_a_full_spool_drops_the_oldest_heartbeats_first_then_the_oldest_of_anything(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path / "spool.sqlite3")
    for number in range(6):
        spool.put(_task(number, padding=1000))
    for number in range(6, 10):
        spool.put(_heartbeat(number, padding=1100))  # each a little larger than a task: one makes room for one
    full = spool.bytes
    spool.close()

    spool = Spool(tmp_path / "spool.sqlite3", max_bytes=full)
    with caplog.at_level(logging.WARNING):
        spool.put(_task(10, padding=1000))
        spool.put(_task(11, padding=1000))
    kinds = _numbers(spool)
    assert kinds == [*[("task", n) for n in range(6)], ("heartbeat", 8), ("heartbeat", 9), ("task", 10), ("task", 11)]
    assert spool.bytes <= spool.max_bytes and spool.dropped == 2
    assert "dropped 1 heartbeats and 0 other messages (1 dropped since" in caplog.text
    for number in range(12, 20):
        spool.put(_task(number, padding=1000))
    kinds = _numbers(spool)
    assert all(kind == "task" for kind, _ in kinds), "every heartbeat went before any task"
    assert [n for _, n in kinds] == list(range(kinds[0][1], 20)), "then the oldest tasks, and the rest keep order"
    assert kinds[0][1] > 0 and spool.bytes <= spool.max_bytes
    assert "dropped 0 heartbeats and 1 other messages" in caplog.text
    spool.close()


def test_a_message_larger_than_the_whole_spool_is_dropped_and_counted(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.sqlite3", max_bytes=500)
    spool.put(_task(1))
    spool.put(_task(2, padding=1000))
    assert _numbers(spool) == [("task", 1)] and spool.dropped == 1
    spool.close()


def test_the_spool_file_is_private_and_one_process_owns_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "agent" / "spool.sqlite3")
    spool.put(_task(1))
    assert (tmp_path / "agent" / "spool.sqlite3").stat().st_mode & 0o077 == 0
    with pytest.raises(SpoolLocked, match="another agent process"):
        Spool(tmp_path / "agent" / "spool.sqlite3")
    spool.close()
    Spool(tmp_path / "agent" / "spool.sqlite3").close()


_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from inventory.agent.remote.spool import Spool

    spool = Spool(Path(sys.argv[1]))
    for number in range(int(sys.argv[2])):
        spool.put({"kind": "task", "task": "jobs.replica_exited", "kwargs": {"n": number}})
    print("spooled", flush=True)
    time.sleep(600)
    """
)


def test_messages_spooled_before_the_agent_is_killed_are_there_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite3"
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path), "300"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "spooled"
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=10)
    finally:
        writer.kill()
    assert writer.returncode == -signal.SIGKILL
    reopened = Spool(path)  # the killed process's lock went with it
    assert _numbers(reopened) == [("task", n) for n in range(300)]
    reopened.close()


def test_live_samples_stay_in_memory_latest_only_and_go_stale() -> None:
    now = [100.0]
    woken: list[bool] = []
    live = LiveSamples(max_age=10.0, on_put=lambda: woken.append(True), clock=lambda: now[0])
    assert live.take() is None
    live.put([{"uuid": "a", "utilization_gpu": 1.0}])
    live.put([{"uuid": "a", "utilization_gpu": 2.0}])
    taken = live.take()
    assert taken is not None and taken.samples == [{"uuid": "a", "utilization_gpu": 2.0}] and woken == [True, True]
    assert live.take() is None, "handed out once"
    live.give_back(taken)
    assert live.take() == taken, "a failed send keeps them for the next batch"
    live.give_back(taken)
    live.put([{"uuid": "a", "utilization_gpu": 3.0}])
    live.give_back(taken)
    newer = live.take()
    assert newer is not None and newer.samples[0]["utilization_gpu"] == 3.0, "never older over newer"
    live.put([{"uuid": "a"}])
    now[0] += 10.5
    assert live.take() is None, "samples older than 10 s are dropped"


def test_samples_never_reach_the_spool_file(spool: Spool) -> None:
    with pytest.raises(ValueError, match="live only"):
        spool.put({"kind": "samples", "samples": [{"uuid": "a"}]})
    spool.put(_heartbeat(1))
    kinds = sqlite3.connect(spool.path).execute("SELECT DISTINCT kind FROM spool").fetchall()
    assert kinds == [("heartbeat",)]
