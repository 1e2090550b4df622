"""1,000 nodes heartbeating through one controller with Redis: controller CPU and heartbeat-to-database lag.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud_bench REDIS_URL=redis://127.0.0.1:6379/1 \
        .venv/bin/python bench/heartbeats.py [--nodes 1000] [--gpus 8] [--interval 5] [--seconds 60]

It migrates the scratch database in DATABASE_URL, registers `--nodes` ready
nodes with `--gpus` GPUs each, and starts one controller exactly as a
deployment does (`gpucloud worker --beat`, Celery prefork with one process
per core). This process then plays the agents: each node posts a report
carrying a simulated sample of every GPU, through the agent's own transport,
every `--interval` seconds, spread evenly. Meanwhile it polls the nodes'
`last_heartbeat_at` and records, for every heartbeat that reached the
database, how long after its sending it got there. The controller's CPU is
read from /proc for its whole process tree over the measured window.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _fleet import fleet
from _proc import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
WARMUP = 10.0


def _setup(nodes: int, gpus: int) -> list[str]:
    """Create (or reset) the bench pool's nodes and GPUs; return the node names."""
    created, _ = fleet("bench-heartbeats", "hb", nodes, gpus, lambda node, g: f"GPU-{node}-{g}")
    return [node.name for node in created]


def _controller(interval: int, data_dir: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "NODE_HEARTBEAT_SECONDS": str(interval), "GPUCLOUD_DATA_DIR": data_dir}
    command = [
        sys.executable,
        "-c",
        "from gpucloud.cli import main; main()",
        "worker",
        "--beat",
        "--loglevel",
        "WARNING",
    ]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Agents:
    """Plays every node's agent: posts each node's report every `interval` seconds, spread evenly."""

    def __init__(self, names: list[str], gpus: int, interval: float) -> None:
        from inventory.agent.probe import simulated_probe

        self.names, self.interval = names, interval
        self.probes = {name: simulated_probe(name, gpu_count=gpus, model="NVIDIA H100 80GB HBM3") for name in names}
        self.sent: dict[str, list[float]] = {name: [] for name in names}
        self.stop = threading.Event()

    def run(self) -> None:
        from dataclasses import asdict

        from inventory.agent import AGENT_VERSION
        from inventory.mailbox import post_report

        step = self.interval / len(self.names)
        started = time.monotonic()
        beat = 0
        while not self.stop.is_set():
            for i, name in enumerate(self.names):
                due = started + beat * self.interval + i * step
                delay = due - time.monotonic()
                if delay > 0 and self.stop.wait(delay):
                    return
                samples = [asdict(s) for s in self.probes[name].sample()]
                sent_at = time.time()
                post_report({"node": name, "agent_version": AGENT_VERSION, "sent_at": sent_at, "samples": samples})
                self.sent[name].append(sent_at)
            beat += 1


def _watch(agents: Agents, lags: list[float], stop: threading.Event, measure_from: float) -> None:
    """Poll last_heartbeat_at; each new value is matched to the latest report sent before it."""
    from inventory.models import Node

    seen: dict[str, float] = {}
    while not stop.wait(0.25):
        for name, at in Node.objects.filter(name__in=agents.names).values_list("name", "last_heartbeat_at"):
            if at is None:
                continue
            stamp = at.timestamp()
            if seen.get(name) == stamp:
                continue
            seen[name] = stamp
            before = [s for s in agents.sent[name] if s <= stamp]
            if before and before[-1] >= measure_from:
                lags.append(stamp - before[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=int, default=5, help="seconds between two heartbeats of one node")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window, after a 10 s warm-up")
    args = parser.parse_args()
    names = _setup(args.nodes, args.gpus)
    from inventory.mailbox import drain_reports

    drain_reports(lambda reports: None)  # leftovers of an earlier run
    agents = Agents(names, args.gpus, args.interval)
    lags: list[float] = []
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as data_dir:
        controller = _controller(args.interval, data_dir)
        try:
            time.sleep(5)  # the worker and beat start
            threading.Thread(target=agents.run, daemon=True).start()
            time.sleep(WARMUP)
            measure_from = time.time()
            watcher = threading.Thread(target=_watch, args=(agents, lags, stop, measure_from), daemon=True)
            watcher.start()
            cpu_before, wall_before = cpu_seconds(controller.pid), time.monotonic()
            time.sleep(args.seconds)
            cpu_used, wall = cpu_seconds(controller.pid) - cpu_before, time.monotonic() - wall_before
        finally:
            agents.stop.set()
            stop.set()
            controller.send_signal(signal.SIGTERM)
            controller.wait(timeout=30)
    lags.sort()
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "gpus_per_node": args.gpus,
                "heartbeat_interval_s": args.interval,
                "reports_per_second": round(args.nodes / args.interval, 1),
                "measured_seconds": round(wall, 1),
                "controller_cpu_cores": round(cpu_used / wall, 3),
                "heartbeats_observed": len(lags),
                "lag_p50_ms": round(statistics.median(lags) * 1000, 1) if lags else None,
                "lag_p99_ms": round(lags[int(len(lags) * 0.99) - 1] * 1000, 1) if lags else None,
                "lag_max_ms": round(lags[-1] * 1000, 1) if lags else None,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
