"""8,000 GPUs sampled at 1 Hz through one controller: its CPU, and how soon each minute's rollups are complete.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud_bench REDIS_URL=redis://127.0.0.1:6379/1 \
        .venv/bin/python bench/telemetry_ingest.py [--nodes 1000] [--gpus 8] [--minutes 3]

It migrates the scratch database in DATABASE_URL, registers `--nodes` ready
nodes with `--gpus` GPUs each and starts one controller exactly as a
deployment does (`gpucloud worker --beat`, as bench/heartbeats.py does):
its beat drains the heartbeat mailbox every second with the real task.
This process then plays the agents: one real `Reporter` per node over a
simulated probe, ticked every second with the nodes' phases spread over
the second (and their heartbeats over the 5 s interval), posting to the
mailbox queue on Redis: every 5 s a report with the last 5 s of samples,
and a flush on the first sample of each minute. The simulated agents share
one broker connection: the agent's own `post_report` opens one per report
(about 3.5 ms of CPU here), which for 1,000 agents in one process would
cost more than the controller and leave the agents behind their schedule.

Samples are stamped with the second they were due, not the moment this
loaded process got to them, so each GPU has exactly 60 samples per minute;
how late the agents' ticks ran is reported (`agent_tick_late_*`).

Measured, for each of `--minutes` whole minutes after a warm-up: the delay
from the minute's end until every GPU has a complete rollup row for it
(60 samples), polling the database every 100 ms, and the controller's CPU
(its whole process tree, from /proc) over those minutes. `flushed_s` says
when the last agent's minute flush left this process (after the minute's
end): a real agent flushes within its phase, under a second; what this
loaded process adds on top shows there, not on the controller's account.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from _fleet import fleet
from _proc import cpu_seconds
from heartbeats import _controller

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
HEARTBEAT_SECONDS = 5
POLL_SECONDS = 0.1


def _setup(nodes: int, gpus: int) -> tuple[list[str], tuple[int, int]]:
    """Create (or reset) the bench pool's nodes and GPUs (UUIDs as their simulated probes report them)."""
    from inventory.drivers.simulated import simulated_uuid

    created, made = fleet("bench-telemetry", "tm", nodes, gpus, simulated_uuid)
    ids = [gpu.pk for gpu in made]
    return [node.name for node in created], (min(ids), max(ids))


class ScheduledClock:
    """A reporter's clock: the time its current tick was due."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Agents:
    """Plays every node's agent with the real reporter; node i ticks at start + i * 5 / N + k seconds."""

    def __init__(self, names: list[str], gpus: int) -> None:
        from gpucloud.celery import app
        from inventory.agent.reporter import Reporter
        from inventory.drivers.simulated import SimulatedProbe
        from inventory.mailbox import QUEUE

        self.connection = app.connection_for_write()
        self.mailbox = self.connection.SimpleQueue(QUEUE, serializer="json")

        self.clocks = [ScheduledClock() for _ in names]
        self.reporters = []
        for name, clock in zip(names, self.clocks, strict=True):
            probe = SimulatedProbe(name, gpu_count=gpus, clock=clock)
            for index, gpu in enumerate(probe.inventory().gpus):
                probe.set_utilization(gpu.uuid, 10.0 * (index + 1))
            reporter = Reporter(
                node=name, probe=probe, send_report=self.mailbox.put, heartbeat_seconds=HEARTBEAT_SECONDS, clock=clock
            )
            self.reporters.append(reporter)
        self.late: list[float] = []
        self.flushed: dict[float, float] = {}
        self.stop = threading.Event()
        self.started = 0.0

    def run(self) -> None:
        count = len(self.reporters)
        self.started = math.ceil(time.time()) + 1.0
        due = [(self.started + i * HEARTBEAT_SECONDS / count, i) for i in range(count)]
        heapq.heapify(due)
        while not self.stop.is_set():
            at, i = heapq.heappop(due)
            delay = at - time.time()
            if delay > 0 and self.stop.wait(delay):
                return
            self.late.append(max(0.0, time.time() - at))
            self.clocks[i].now = at
            self.reporters[i].tick()
            if at % 60 < 1.0:  # the node's first tick of a minute flushed the one before
                self.flushed[at // 60 * 60 - 60] = time.time()
            heapq.heappush(due, (at + 1.0, i))


def _complete(gpu_ids: tuple[int, int], minute: float, samples: int) -> int:
    """Return how many of the bench's GPUs (an id range) have a rollup row for `minute` with all its samples."""
    from datetime import UTC, datetime

    from inventory.models import GpuMinute

    at = datetime.fromtimestamp(minute, UTC)
    rows = GpuMinute.objects.filter(minute=at, gpu_id__gte=gpu_ids[0], gpu_id__lte=gpu_ids[1], samples__gte=samples)
    return rows.count()  # by the minute index alone: polling must not load the database it measures


def _measure(gpu_ids: tuple[int, int], gpus: int, minutes: list[float]) -> dict[float, float]:
    """Poll until every GPU has a complete row for each of `minutes`; return {minute: seconds after its end}."""
    delays: dict[float, float] = {}
    for minute in minutes:
        end = minute + 60
        time.sleep(max(0.0, end - time.time()))
        while _complete(gpu_ids, minute, 60) < gpus:
            if time.time() > end + 120:
                break  # reported as missing
            time.sleep(POLL_SECONDS)
        else:
            delays[minute] = time.time() - end
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--minutes", type=int, default=3, help="whole minutes measured (at least 2)")
    args = parser.parse_args()
    names, gpu_ids = _setup(args.nodes, args.gpus)
    from inventory.mailbox import drain_reports

    drain_reports(lambda reports: None)  # leftovers of an earlier run
    agents = Agents(names, args.gpus)
    total = args.nodes * args.gpus
    with tempfile.TemporaryDirectory() as data_dir:
        controller = _controller(HEARTBEAT_SECONDS, data_dir)
        try:
            time.sleep(5)  # the worker and beat start
            threading.Thread(target=agents.run, daemon=True).start()
            time.sleep(2)
            # The first minute every node samples from its start (all started within 5 s), plus one of warm-up.
            first = (math.floor((agents.started + HEARTBEAT_SECONDS) / 60) + 2) * 60.0
            measured = [first + 60 * m for m in range(max(args.minutes, 2))]
            time.sleep(max(0.0, first - time.time()))
            cpu_before, wall_before = cpu_seconds(controller.pid), time.monotonic()
            delays = _measure(gpu_ids, total, measured)
            cpu_used, wall = cpu_seconds(controller.pid) - cpu_before, time.monotonic() - wall_before
        finally:
            agents.stop.set()
            controller.send_signal(signal.SIGTERM)
            controller.wait(timeout=30)
    late = sorted(agents.late[len(agents.late) // 4 :])  # past the start-up
    flushed = [round(agents.flushed[m] - (m + 60), 2) if m in agents.flushed else None for m in measured]
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "gpus": total,
                "sample_hz": 1,
                "heartbeat_interval_s": HEARTBEAT_SECONDS,
                "minutes_measured": len(measured),
                "minutes_complete": len(delays),
                "rollup_delay_s": [round(delays[m], 2) if m in delays else None for m in measured],
                "rollup_delay_max_s": round(max(delays.values()), 2) if delays else None,
                "flushed_s": flushed,
                "measured_seconds": round(wall, 1),
                "controller_cpu_cores": round(cpu_used / wall, 3),
                "agent_tick_late_p50_ms": round(late[len(late) // 2] * 1000, 1) if late else None,
                "agent_tick_late_max_ms": round(late[-1] * 1000, 1) if late else None,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
