"""What a scale run watches: each process tree's CPU, the controller's threads, the queues and the Postgres
backends each second (`Watch`), and what the workers' logs say (`tasks`, `problems`); Linux only."""

from __future__ import annotations

import math
import os
import re
import statistics
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _proc import CLOCK_TICKS, _stat_fields, descendants, oldest_named

TASK_LINE = re.compile(r"^\[([\d-]+ [\d:]+),\d+: .*Task ([\w.]+)\[[^\]]+\] succeeded in ([0-9.e-]+)s: (.*)$")
PLACED = re.compile(r"'placed': (\d+)")


def _ticks(pid: int) -> int | None:
    try:
        fields = _stat_fields(pid)
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def _threads(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
    return total


def _postgres_backends(database: str, exclude: set[int]) -> list[int]:
    """Return the pids of the Postgres backends serving `database` (by process title), but `exclude`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if title.startswith("postgres: ") and f" {database} " in title:
            found.append(int(entry.name))
    return found


@dataclass
class Meter:
    """CPU ticks of a changing set of processes: a process's ticks count from when it was first seen
    (from 0 if it started after the meter did), up to its last sample (so exited processes still count)."""

    first: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    started: bool = False

    def sample(self, pids: list[int]) -> float:
        """Sample `pids`; return the CPU seconds used by everything seen so far."""
        for pid in pids:
            ticks = _ticks(pid)
            if ticks is None:
                continue
            self.first.setdefault(pid, ticks if not self.started else 0)
            self.last[pid] = ticks
        self.started = True
        return sum(self.last[pid] - self.first[pid] for pid in self.last) / CLOCK_TICKS


@dataclass
class Watch:
    """One sample a second of every component's CPU, the controller's threads, the queues and the ledger."""

    processes: dict[str, subprocess.Popen[bytes]]
    database: str
    redis_url: str
    exclude: set[int]
    meters: dict[str, Meter] = field(default_factory=lambda: defaultdict(Meter))
    series: list[dict[str, Any]] = field(default_factory=list)

    def pids(self) -> dict[str, list[int]]:
        trees = {name: [p.pid, *descendants(p.pid)] for name, p in self.processes.items()}
        redis_server = oldest_named("redis-server")
        trees["postgres"] = _postgres_backends(self.database, self.exclude)
        trees["redis"] = [redis_server] if redis_server else []
        return trees

    def sample(self, states: dict[str, int], allocations: int) -> dict[str, Any]:
        import redis

        trees = self.pids()
        broker = redis.Redis.from_url(self.redis_url)
        row: dict[str, Any] = {"t": time.time(), "states": states, "active_allocations": allocations}
        row["cpu"] = {name: self.meters[name].sample(pids) for name, pids in trees.items()}
        row["queues"] = {name: int(broker.llen(name)) for name in ("control", "ingest")}  # type: ignore[arg-type]
        row["controller_threads"] = _threads(trees["controller"])
        row["backends"] = _backends(self.database)
        row["machine_busy_s"] = _machine_busy()
        row["load"] = os.getloadavg()[0]
        self.series.append(row)
        return row


def _machine_busy() -> float:
    """Return the CPU seconds every core of the machine spent busy (not idle or waiting for I/O) so far."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / CLOCK_TICKS


def _backends(database: str) -> dict[str, int]:
    """Return the scratch database's other backends running a statement now: how many, and how many wait on a lock."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(*) FILTER (WHERE wait_event_type = 'Lock') FROM pg_stat_activity "
            "WHERE datname = %s AND state = 'active' AND pid <> pg_backend_pid()",
            [database],
        )
        active, waiting = cursor.fetchone()
    return {"active": int(active), "lock_waits": int(waiting)}


def tasks(log: Path, since: float) -> dict[str, dict[str, dict[str, float]]]:
    """Per task of a worker's log, before `since` (idle) and after it (run): how many succeeded, their
    total and largest seconds (and the most a scheduling pass placed)."""
    from datetime import UTC, datetime

    windows: dict[str, dict[str, dict[str, float]]] = {"idle": {}, "run": {}}
    for line in log.read_text(errors="replace").splitlines():
        found = TASK_LINE.search(line)
        if not found:
            continue
        at = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
        stats = windows["run" if at >= math.floor(since) else "idle"]
        task, seconds = found.group(2), float(found.group(3))
        entry = stats.setdefault(task, {"count": 0, "total_s": 0.0, "max_s": 0.0})
        entry["count"] += 1
        entry["total_s"] = round(entry["total_s"] + seconds, 3)
        entry["max_s"] = max(entry["max_s"], round(seconds, 3))
        placed = PLACED.search(found.group(4))
        if placed:
            entry["max_placed"] = max(entry.get("max_placed", 0), int(placed.group(1)))
    return {
        window: dict(sorted(stats.items(), key=lambda item: -item[1]["total_s"])) for window, stats in windows.items()
    }


def problems(log: Path) -> dict[str, int]:
    """Count the log's WARNING and ERROR lines by their message (first 100 characters after the level)."""
    found: dict[str, int] = defaultdict(int)
    for line in log.read_text(errors="replace").splitlines():
        level = re.search(r"\b(WARNING|ERROR|CRITICAL)(?:/[^\]]*\])?:?\s*(.*)", line)
        if level:
            found[f"{level.group(1)} {level.group(2)[:100]}"] += 1
    return dict(sorted(found.items(), key=lambda item: -item[1])[:8])


def cpu(series: list[dict[str, Any]], start: float, idle_cpu: dict[str, float], idle_s: float) -> dict[str, Any]:
    """Each component's CPU seconds over the run, average and busiest-5-s cores, and idle cores before it."""
    window = [row for row in series if row["t"] >= start]
    elapsed = window[-1]["t"] - window[0]["t"]
    machine = (window[-1]["machine_busy_s"] - window[0]["machine_busy_s"]) / elapsed
    ours = sum(window[-1]["cpu"][name] - window[0]["cpu"][name] for name in window[0]["cpu"]) / elapsed
    figures: dict[str, Any] = {
        "machine": {"busy_cores": round(machine, 2), "load_mean": round(statistics.mean(r["load"] for r in window), 2)},
        "others": {"cores": round(machine - ours, 2)},
    }
    for name in window[0]["cpu"]:
        used = window[-1]["cpu"][name] - window[0]["cpu"][name]
        peak = max(
            ((b["cpu"][name] - a["cpu"][name]) / (b["t"] - a["t"]) for a, b in zip(window, window[5:], strict=False)),
            default=0.0,
        )
        figures[name] = {
            "cpu_s": round(used, 1),
            "cores": round(used / elapsed, 2),
            "peak_5s_cores": round(peak, 2),
            "idle_cores": round(idle_cpu.get(name, 0.0) / idle_s, 3) if idle_s else None,
        }
    return figures


def peaks(series: list[dict[str, Any]]) -> dict[str, float]:
    backends = [row["backends"] for row in series if "backends" in row]
    return {
        "active_backends_mean": round(statistics.mean(b["active"] for b in backends), 2),
        "lock_waiting_backends_mean": round(statistics.mean(b["lock_waits"] for b in backends), 2),
        "control_queue_max": max(row["queues"]["control"] for row in series),
        "ingest_queue_max": max(row["queues"]["ingest"] for row in series),
        "controller_threads_max": max(row["controller_threads"] for row in series),
    }
