"""The remote agent's spool: write throughput, and a console outage under a steady stream of log batches.

    .venv/bin/python bench/agent_spool.py [--writes 5000] [--outage-seconds 30] [--rate 20] [--lines 100]

No services needed: the spool is SQLite in a scratch directory, and the
console is `tests.inventory.console_stub.ConsoleStub`, a real HTTP server
on loopback speaking the agent protocol.

1. Write throughput: `--writes` log-batch messages (`--lines` lines of
   `--line-bytes` each, the shape of a `jobs.ingest_log_batches` report)
   put one by one, each committed, as the executor's outbox puts them.
2. Outage: a producer thread spools `--rate` log batches a second while
   the real sender (default back-off: 0.5 s doubling to 30 s, full
   jitter) ships them. After `--warmup` seconds the console goes away
   (its port refuses connections) for `--outage-seconds`, then comes back
   on the same port; the producer goes on for `--after` seconds more.
   Reported: lines produced and delivered (equal, in order, or the run
   fails), the spool's peak size, and from the console's return: the first
   delivery (the sender's back-off still running out) and the spool empty.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.protocol.messages import LogBatches  # noqa: E402  # after the checkout is on the path
from inventory.agent.remote.client import ConsoleClient  # noqa: E402
from inventory.agent.remote.sender import Sender  # noqa: E402
from inventory.agent.remote.spool import LiveSamples, Spool  # noqa: E402
from tests.inventory.console_stub import ConsoleStub  # noqa: E402

CREDENTIAL = "bench-credential"


def log_batch(number: int, lines: int, line_bytes: int) -> dict[str, Any]:
    """Return a spool message shaped like the executor's `jobs.ingest_log_batches` report of one batch."""
    text = "x" * line_bytes
    batch = {
        "workload_id": 1,
        "attempt": 1,
        "replica": 0,
        "since": f"c{number - 1}",
        "cursor": f"c{number}",
        "lines": [["2026-01-01T00:00:00.000000000Z", "stdout", text] for _ in range(lines)],
        "marks": [f"c{number}.{index}" for index in range(lines)],
        "seq": number,
    }
    return {"kind": "task", "task": LogBatches.TASK, "kwargs": {"batches": [batch]}}


def write_throughput(directory: Path, writes: int, lines: int, line_bytes: int) -> dict[str, float]:
    spool = Spool(directory / "throughput.sqlite3", max_bytes=1 << 40)
    messages = [log_batch(number, lines, line_bytes) for number in range(writes)]
    started = time.perf_counter()
    for message in messages:
        spool.put(message)
    elapsed = time.perf_counter() - started
    size = spool.bytes
    spool.close()
    return {"messages_per_s": writes / elapsed, "mb_per_s": size / elapsed / 1e6, "message_kb": size / writes / 1e3}


class Producer:
    """Spools `rate` log batches a second until stopped; remembers the sequence numbers and the peak spool size."""

    def __init__(self, spool: Spool, rate: float, lines: int, line_bytes: int) -> None:
        self.spool, self.rate, self.lines, self.line_bytes = spool, rate, lines, line_bytes
        self.produced = 0
        self.peak_bytes = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopped.is_set():
            self.spool.put(log_batch(self.produced, self.lines, self.line_bytes))
            self.produced += 1
            self.peak_bytes = max(self.peak_bytes, self.spool.bytes)
            next_at += 1 / self.rate
            self.stopped.wait(max(0.0, next_at - time.monotonic()))


def delivered_sequence(stub: ConsoleStub) -> list[int]:
    return [m["kwargs"]["batches"][0]["seq"] for m in stub.messages("task")]


def wait_for(predicate: Any, timeout: float) -> float | None:
    """Return the seconds until `predicate()` held (polled every 10 ms), or None after `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.01)
    return None


def outage(directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    stub = ConsoleStub(credential=CREDENTIAL).start()
    port = int(stub.url.rsplit(":", 1)[1])
    spool = Spool(directory / "outage.sqlite3")
    live = LiveSamples()
    client = ConsoleClient(stub.url, credential=CREDENTIAL)
    sender = Sender(spool, live, client.post_reports)
    spool.on_put = sender.wake
    producer = Producer(spool, args.rate, args.lines, args.line_bytes)
    sender.start()
    threading.Thread(target=producer.run, daemon=True).start()
    time.sleep(args.warmup)
    stub.stop()  # the port now refuses connections
    time.sleep(args.outage_seconds)
    before = delivered_sequence(stub)
    stub = ConsoleStub(credential=CREDENTIAL).start(port)
    back = time.monotonic()
    first = wait_for(lambda: len(stub.messages()) > 0, timeout=120)
    time.sleep(max(0.0, args.after - (time.monotonic() - back)))
    producer.stopped.set()
    drained = wait_for(lambda: len(spool) == 0, timeout=120)
    drain_seconds = None if drained is None else time.monotonic() - back
    sender.stop()
    sequence = before + delivered_sequence(stub)
    stub.stop()
    client.close()
    spool.close()
    return {
        "produced": producer.produced,
        "sequence": sequence,  # what both servers (before and after the outage) took, in order
        "first_after_s": first,
        "drain_s": drain_seconds,
        "peak_bytes": producer.peak_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=5000)
    parser.add_argument("--outage-seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=20.0, help="log batches spooled per second")
    parser.add_argument("--lines", type=int, default=100, help="lines per log batch")
    parser.add_argument("--line-bytes", type=int, default=120)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--after", type=float, default=5.0, help="seconds the producer goes on after the outage")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    with tempfile.TemporaryDirectory() as scratch:
        writes = write_throughput(Path(scratch), args.writes, args.lines, args.line_bytes)
        result = outage(Path(scratch), args)
    produced = result["produced"]
    sequence = result["sequence"]
    in_order = sequence == list(range(len(sequence)))
    delivered = len(sequence)
    rows = [
        ("spool writes (log batches/s)", f"{writes['messages_per_s']:,.0f}"),
        ("spool writes (MB/s)", f"{writes['mb_per_s']:,.1f}"),
        ("log batch size (KB)", f"{writes['message_kb']:,.1f}"),
        ("outage (s)", f"{args.outage_seconds:g}"),
        ("lines produced", f"{produced * args.lines:,}"),
        ("lines delivered", f"{delivered * args.lines:,}"),
        ("delivered in order, no duplicates", "yes" if in_order else "NO"),
        ("spool peak (MB)", f"{result['peak_bytes'] / 1e6:,.1f}"),
        ("first delivery after recovery (s)", _seconds(result["first_after_s"])),
        ("spool empty after recovery (s)", _seconds(result["drain_s"])),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value:>12}")
    if delivered != produced or not in_order:
        raise SystemExit("FAILED: lines were lost, duplicated or reordered")


def _seconds(value: float | None) -> str:
    return "timed out" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
