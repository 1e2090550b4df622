"""Scale: simulated hosts through the real web, controller and ingest worker, on Postgres and Redis.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud_scale REDIS_URL=redis://127.0.0.1:6379/5 \
    SECRET_KEY=$(openssl rand -hex 40) .venv/bin/python bench/fleet_scale.py [--nodes 1000] [--gpus 8] \
        [--workloads 20000] [--tenants 10] [--duration 30] [--clients 4] [--batch 1000] [--keep]

It (re)creates the scratch database named in DATABASE_URL (its name must
contain `scale` or `bench`: the bench drops it) and empties the Redis
database in REDIS_URL (not database 0), registers `--nodes` ready simulated
nodes of `--gpus` GPUs in one pool, `--tenants` tenants with one project
each (guarantees summing to the fleet, the whole fleet as limit) and an API
token of a member of each, then starts the processes of a deployment as
docs/deploy.md starts them: the web (`gpucloud serve`), the controller
(`gpucloud worker --queues control --beat`) and the ingest worker
(`gpucloud worker --queues ingest`), logs at INFO as deployed. Simulated
nodes have no agent: their heartbeats (`inventory.heartbeat_simulated_nodes`)
and their node-local work (start, watch, log shipping, exit) run in the
controller, so its figures include what agents would do on their hosts.

After `--idle` seconds of heartbeats alone (the fleet's idle cost), it
submits `--workloads` one-GPU jobs through the real API in bulk
(`POST /api/v1/tenants/<t>/workloads/bulk/`, `--batch` per request, from
`--clients` threads) and polls the ledger each second until every workload
has ended and every allocation is released (the ledger's usage is then
complete: accounting reads it from the allocations), or `--timeout`.

Each workload runs `--duration` seconds. A submission cannot set a
simulated run's duration (the controller's replica spec carries no labels,
so `simulate.duration_seconds` never reaches the runtime): the bench sets
the simulated runtime's default duration in the controller process before
it starts (`--duration 60`, the runtime's own default, changes nothing).

It prints a table and the same figures as JSON: submissions accepted per
second, how long the fleet took to fill and the placements per second,
end-to-end workloads per second against the fleet's ideal
(GPUs / duration), submit-to-running and launch latencies, each process
tree's CPU (average and busiest 5 s), the Postgres backends of the scratch
database and Redis, the deepest `control` and `ingest` queues, the
controller's threads, and per task the count and time the workers' logs
give (`Task ... succeeded in`). The processes' logs stay in LOGS.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from _fleet import fleet
from _proc import CLOCK_TICKS, _stat_fields, descendants, oldest_named
from list_projects import _free_port, _listening

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
POOL = "scale"
IMAGE = "registry.example.com/train:1"
LOGS = Path("/tmp/gpucloud-fleet-scale")  # noqa: S108 -- the processes' logs, kept for a look after a run
TASK_LINE = re.compile(r"Task ([\w.]+)\[[^\]]+\] succeeded in ([0-9.e-]+)s: (.*)$")
PLACED = re.compile(r"'placed': (\d+)")
CLI = "from gpucloud.cli import main; main()"
WORKER = "import sys; sys.path.insert(0, 'bench'); import fleet_scale; fleet_scale.worker()"


# --- the scratch database and Redis ------------------------------------------------------------


def _scratch() -> tuple[str, str]:
    """Recreate the scratch database and empty the Redis database; return (database name, Redis URL)."""
    database, redis_url = urlparse(os.environ.get("DATABASE_URL", "")), os.environ.get("REDIS_URL", "")
    name = database.path.lstrip("/")
    if database.scheme not in ("postgres", "postgresql") or not ("scale" in name or "bench" in name):
        raise SystemExit("DATABASE_URL must name a scratch Postgres database (`scale` or `bench` in its name).")
    if not redis_url or urlparse(redis_url).path.strip("/") in ("", "0"):
        raise SystemExit("REDIS_URL must name a scratch Redis database other than 0: the bench empties it.")
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _admin(f'CREATE DATABASE "{name}"')
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    return name, redis_url


def _admin(statement: str) -> None:
    """Run `statement` on the server's `postgres` database, as the user of DATABASE_URL."""
    import psycopg

    url = urlparse(os.environ["DATABASE_URL"])
    with psycopg.connect(url._replace(path="/postgres").geturl(), autocommit=True) as conn:
        conn.execute(statement)  # type: ignore[arg-type]  # a fixed statement with the checked scratch name


def _drop(name: str) -> None:
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the fleet, tenants and tokens -------------------------------------------------------------


@dataclass(frozen=True)
class Client:
    tenant: str
    secret: str


def _setup(nodes: int, gpus: int, tenants: int) -> list[Client]:
    """Create the fleet, and `tenants` tenants sharing it; return each tenant's member token."""
    from inventory.drivers.simulated_probe import simulated_uuid

    fleet(POOL, "sim", nodes, gpus, simulated_uuid, simulated=True)
    capacity = nodes * gpus
    return [_tenant(t, capacity, _share(capacity, tenants, t)) for t in range(tenants)]


def _share(capacity: int, tenants: int, index: int) -> int:
    """Tenant `index`'s guarantee: the fleet split evenly, the remainder to the first ones."""
    return capacity // tenants + (1 if index < capacity % tenants else 0)


def _tenant(index: int, capacity: int, guaranteed: int) -> Client:
    from django.contrib.auth.models import User

    from inventory.models import NodePool
    from tenants.context import Actor
    from tenants.models import Membership, Project, ProjectQuota, Tenant, TenantQuota
    from tenants.services import create_token

    pool = NodePool.objects.get(name=POOL)
    tenant = Tenant.objects.create(slug=f"scale-{index:02d}", name=f"Scale {index}")
    project = Project.all_tenants.create(tenant=tenant, slug="train", name="Train")
    quota = {"guaranteed": guaranteed, "limit": capacity}
    TenantQuota.all_tenants.create(tenant=tenant, pool=pool, **quota)
    ProjectQuota.all_tenants.create(tenant=tenant, project=project, pool=pool, **quota)
    user = User.objects.create(username=f"scale-member-{index:02d}")
    membership = Membership.all_tenants.create(tenant=tenant, user=user, role="member")
    membership.projects.add(project)
    issued = create_token(actor=Actor(user=user), tenant=tenant, name="scale", role="member", expires_in_days=1)
    return Client(tenant.slug, issued.secret)


# --- the processes of a deployment ------------------------------------------------------------


def _start(name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    LOGS.mkdir(exist_ok=True)
    with (LOGS / f"{name}.log").open("wb") as log:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def worker() -> None:
    """Run `gpucloud worker` as deployed, with what this bench adds to each worker process before it starts:
    the simulated runtime's default duration (FLEET_SCALE_DURATION) and Celery's line per task done, which
    the settings keep at DEBUG only (`celery.app.trace`), turned on in each pool process."""
    import logging

    import django

    django.setup()
    from celery.signals import worker_process_init

    import inventory.drivers.simulated as simulated
    from gpucloud.cli import main as gpucloud

    simulated.DEFAULT_DURATION = float(os.environ.get("FLEET_SCALE_DURATION", simulated.DEFAULT_DURATION))

    def trace(**_: object) -> None:
        logging.getLogger("celery.app.trace").setLevel(logging.INFO)

    worker_process_init.connect(trace, weak=False)
    gpucloud()


def _processes(port: int, duration: float) -> dict[str, subprocess.Popen[bytes]]:
    env = {**os.environ, "GPUCLOUD_DATA_DIR": str(LOGS / "data"), "FLEET_SCALE_DURATION": str(duration)}
    python = sys.executable
    web = _start("web", [python, "-c", CLI, "serve", "--port", str(port)], env)
    started = {
        "web": web,
        "controller": _start("controller", [python, "-c", WORKER, "worker", "--queues", "control", "--beat"], env),
        "ingest": _start("ingest", [python, "-c", WORKER, "worker", "--queues", "ingest"], env),
    }
    _listening(web, port, "gpucloud serve")
    return started


def _stop(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    for process in processes.values():
        process.send_signal(signal.SIGTERM)
    for process in processes.values():
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _await_heartbeats(since: float, timeout: float = 120.0) -> None:
    """Return once every node heartbeated after `since` (the controller and its beat run); exit if none do."""
    from datetime import UTC, datetime

    from inventory.models import Node

    moment = datetime.fromtimestamp(since, tz=UTC)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Node.objects.filter(pool__name=POOL, last_heartbeat_at__lt=moment).exists():
            return
        time.sleep(1)
    raise SystemExit(f"the controller's heartbeats did not reach every node in {timeout:.0f} s (logs: {LOGS})")


# --- CPU, threads and queues, sampled each second -----------------------------------------------


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
        self.series.append(row)
        return row


def _ledger(pool: Any) -> tuple[dict[str, int], int]:
    from django.db.models import Count

    from jobs.models import Allocation, Workload

    rows = Workload.all_tenants.filter(pool=pool).values("state").annotate(n=Count("id")).order_by()
    active = Allocation.all_tenants.filter(workload__pool=pool, released_at__isnull=True).count()
    return {row["state"]: row["n"] for row in rows}, active


# --- submissions ---------------------------------------------------------------------------


def _items(first: int, count: int) -> list[dict[str, Any]]:
    return [
        {"name": f"train-{i}", "image": IMAGE, "pool": POOL, "command": ["python", "train.py"], "gpus_per_replica": 1}
        for i in range(first, first + count)
    ]


def _batches(clients: list[Client], workloads: int, size: int) -> queue.Queue[tuple[Client, int, int]]:
    """Return (client, first index, count) batches, tenants taking turns, so every tenant has work early."""
    per_tenant = [workloads // len(clients) + (1 if t < workloads % len(clients) else 0) for t in range(len(clients))]
    batches: queue.Queue[tuple[Client, int, int]] = queue.Queue()
    offsets = [sum(per_tenant[:t]) for t in range(len(clients))]
    for round_ in range(math.ceil(max(per_tenant) / size)):
        for t, client in enumerate(clients):
            count = min(size, per_tenant[t] - round_ * size)
            if count > 0:
                batches.put((client, offsets[t] + round_ * size, count))
    return batches


def _submitter(
    port: int, batches: queue.Queue[tuple[Client, int, int]], answers: list[tuple[float, float, int]]
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    while True:
        try:
            client, first, count = batches.get_nowait()
        except queue.Empty:
            return
        body = json.dumps({"project": "train", "items": _items(first, count)})
        headers = {"Authorization": f"Bearer {client.secret}", "Host": "127.0.0.1", "Content-Type": "application/json"}
        started = time.time()
        conn.request("POST", f"/api/v1/tenants/{client.tenant}/workloads/bulk/", body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        if response.status != 201:
            raise SystemExit(f"bulk submission answered {response.status}: {data[:300]!r} (logs: {LOGS})")
        answers.append((started, time.time(), count))


def _submit(port: int, clients: list[Client], workloads: int, size: int, threads: int) -> list[threading.Thread]:
    """Start the submitting threads; they append (sent, answered, count) to SUBMITTED."""
    batches = _batches(clients, workloads, size)
    started = [
        threading.Thread(target=_submitter, args=(port, batches, SUBMITTED), daemon=True) for _ in range(threads)
    ]
    for thread in started:
        thread.start()
    return started


SUBMITTED: list[tuple[float, float, int]] = []


# --- the run --------------------------------------------------------------------------------


def _run_until_done(watch: Watch, workloads: int, timeout: float, progress: bool) -> bool:
    """Sample every second until every workload ended and no allocation is held; return False on timeout."""
    from inventory.models import NodePool
    from jobs.choices import TERMINAL_STATES

    pool = NodePool.objects.get(name=POOL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1)
        states, active = _ledger(pool)
        row = watch.sample(states, active)
        ended = sum(n for state, n in states.items() if state in TERMINAL_STATES)
        if progress and len(watch.series) % 10 == 0:
            print(f"  {len(watch.series):4d} s  {states}  held {active}  queues {row['queues']}", file=sys.stderr)
        if ended >= workloads and active == 0:
            return True
    return False


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _timeline(first_submit: float, slots: int, duration: float) -> dict[str, Any]:
    """What the ledger says of every workload: fill time, throughput, latencies, GPU time held."""
    from django.db.models import F, Sum

    from jobs.models import Allocation, Workload

    rows = list(
        Workload.all_tenants.filter(pool__name=POOL).values_list(
            "state", "submitted_at", "scheduled_at", "started_at", "finished_at"
        )
    )
    count = len(rows)
    scheduled = sorted(r[2].timestamp() for r in rows if r[2])
    finished = sorted(r[4].timestamp() for r in rows if r[4])
    to_running = [r[3].timestamp() - r[1].timestamp() for r in rows if r[3]]
    launch = [r[3].timestamp() - r[2].timestamp() for r in rows if r[3] and r[2]]
    ran = [r[4].timestamp() - r[3].timestamp() for r in rows if r[4] and r[3]]
    wave = min(count, slots)
    filled = scheduled[wave - 1] - first_submit if len(scheduled) >= wave else None
    end_to_end = finished[-1] - first_submit if finished else None
    held = Allocation.all_tenants.filter(workload__pool__name=POOL, released_at__isnull=False).aggregate(
        s=Sum(F("released_at") - F("created_at"))
    )["s"]
    held_s = held.total_seconds() if held else 0.0
    mid = finished[count // 4 : 3 * count // 4] if len(finished) == count else []
    return {
        "succeeded": sum(1 for r in rows if r[0] == "succeeded"),
        "states": dict(sorted(_counts(r[0] for r in rows).items())),
        "fleet_filled_s": _seconds(filled),
        "placements_per_s_filling": round(wave / filled, 1) if filled else None,
        "all_placed_s": _seconds(scheduled[-1] - first_submit if scheduled else None),
        "end_to_end_s": _seconds(end_to_end),
        "workloads_per_s": round(count / end_to_end, 1) if end_to_end else None,
        "steady_workloads_per_s": round(len(mid) / (mid[-1] - mid[0]), 1) if len(mid) > 1 else None,
        "ideal_workloads_per_s": round(slots / duration, 1),
        "submit_to_running_p50_s": _seconds(_percentile(to_running, 0.5)),
        "submit_to_running_p95_s": _seconds(_percentile(to_running, 0.95)),
        "launch_p50_s": _seconds(_percentile(launch, 0.5)),
        "launch_p95_s": _seconds(_percentile(launch, 0.95)),
        "launch_max_s": _seconds(max(launch) if launch else None),
        "run_in_ledger_p50_s": _seconds(_percentile(ran, 0.5)),
        "run_in_ledger_p95_s": _seconds(_percentile(ran, 0.95)),
        "gpu_seconds_held": round(held_s),
        "gpu_seconds_run": round(count * duration),
        "gpu_held_per_workload_s": round(held_s / count, 2) if count else None,
    }


def _counts(values: Any) -> dict[str, int]:
    counted: dict[str, int] = defaultdict(int)
    for value in values:
        counted[value] += 1
    return counted


def _tasks(name: str) -> dict[str, dict[str, float]]:
    """Per task of a worker's log: how many succeeded, their total and largest seconds (and most placed)."""
    stats: dict[str, dict[str, float]] = {}
    for line in (LOGS / f"{name}.log").read_text(errors="replace").splitlines():
        found = TASK_LINE.search(line)
        if not found:
            continue
        task, seconds = found.group(1), float(found.group(2))
        entry = stats.setdefault(task, {"count": 0, "total_s": 0.0, "max_s": 0.0})
        entry["count"] += 1
        entry["total_s"] = round(entry["total_s"] + seconds, 3)
        entry["max_s"] = max(entry["max_s"], round(seconds, 3))
        placed = PLACED.search(found.group(3))
        if placed:
            entry["max_placed"] = max(entry.get("max_placed", 0), int(placed.group(1)))
    return dict(sorted(stats.items(), key=lambda item: -item[1]["total_s"]))


def _problems(name: str) -> dict[str, int]:
    """Count the log's WARNING and ERROR lines by their message (first 100 characters after the level)."""
    found: dict[str, int] = defaultdict(int)
    for line in (LOGS / f"{name}.log").read_text(errors="replace").splitlines():
        level = re.search(r"\b(WARNING|ERROR|CRITICAL)(?:/[^\]]*\])?:?\s*(.*)", line)
        if level:
            found[f"{level.group(1)} {level.group(2)[:100]}"] += 1
    return dict(sorted(found.items(), key=lambda item: -item[1])[:8])


def _cpu(series: list[dict[str, Any]], start: float, idle_cpu: dict[str, float], idle_s: float) -> dict[str, Any]:
    """Each component's CPU seconds over the run, average and busiest-5-s cores, and idle cores before it."""
    window = [row for row in series if row["t"] >= start]
    elapsed = window[-1]["t"] - window[0]["t"]
    figures: dict[str, Any] = {}
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


def _peaks(series: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "control_queue_max": max(row["queues"]["control"] for row in series),
        "ingest_queue_max": max(row["queues"]["ingest"] for row in series),
        "controller_threads_max": max(row["controller_threads"] for row in series),
    }


def _table(result: dict[str, Any]) -> str:
    t, cpu = result["timeline"], result["cpu"]
    lines = [
        f"{result['nodes']} simulated nodes x {result['gpus_per_node']} GPUs, {result['workloads']} workloads "
        f"of {result['duration_s']} s, {result['tenants']} tenants",
        f"submitted            {result['submission']['workloads_per_s']} workloads/s accepted "
        f"({result['submission']['requests']} bulk requests, {result['submission']['seconds']} s)",
        f"fleet filled         {t['fleet_filled_s']} s after the first submit, "
        f"{t['placements_per_s_filling']} placements/s",
        f"all placed           {t['all_placed_s']} s",
        f"end to end           {t['end_to_end_s']} s, {t['workloads_per_s']} workloads/s "
        f"(steady {t['steady_workloads_per_s']}/s, ideal {t['ideal_workloads_per_s']}/s)",
        f"submit -> running    p50 {t['submit_to_running_p50_s']} s, p95 {t['submit_to_running_p95_s']} s",
        f"scheduled -> running p50 {t['launch_p50_s']} s, p95 {t['launch_p95_s']} s, max {t['launch_max_s']} s",
        f"GPU held / workload  {t['gpu_held_per_workload_s']} s for {result['duration_s']} s of run",
        f"ended                {t['states']}",
        "",
        f"{'component':<12}{'cpu s':>9}{'cores':>8}{'peak 5s':>9}{'idle':>8}",
    ]
    for name, figures in cpu.items():
        idle = figures["idle_cores"]
        lines.append(
            f"{name:<12}{figures['cpu_s']:>9}{figures['cores']:>8}{figures['peak_5s_cores']:>9}"
            f"{'' if idle is None else idle:>8}"
        )
    lines.append("")
    lines.append(", ".join(f"{k} {v}" for k, v in result["peaks"].items()))
    for worker in ("controller", "ingest"):
        for task, stats in list(result["tasks"][worker].items())[:8]:
            lines.append(f"{worker:<11} {task:<40} {stats}")
    return "\n".join(lines)


def _own_backend() -> set[int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return {int(cursor.fetchone()[0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--workloads", type=int, default=20000)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds each workload runs")
    parser.add_argument("--clients", type=int, default=4, help="threads sending bulk submissions")
    parser.add_argument("--batch", type=int, default=1000, help="workloads per bulk request (at most 2000)")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of heartbeats alone measured first")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for every workload's end")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database (it is dropped otherwise)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args()
    database, redis_url = _scratch()
    clients = _setup(args.nodes, args.gpus, args.tenants)
    exclude = _own_backend()
    port = _free_port()
    launched = time.time()
    processes = _processes(port, args.duration)
    try:
        _await_heartbeats(launched)
        watch = Watch(processes, database, redis_url, exclude)
        from django.db import close_old_connections

        close_old_connections()
        exclude |= _own_backend()
        first = watch.sample({}, 0)
        time.sleep(args.idle)
        idle_row = watch.sample({}, 0)
        idle_cpu = {name: idle_row["cpu"][name] - first["cpu"][name] for name in first["cpu"]}
        idle_s = idle_row["t"] - first["t"]
        submit_from = time.time()
        submitters = _submit(port, clients, args.workloads, args.batch, args.clients)
        done = _run_until_done(watch, args.workloads, args.timeout, not args.quiet)
        for thread in submitters:
            thread.join(timeout=1)
    finally:
        _stop(processes)
    answered = max(end for _, end, _ in SUBMITTED) - submit_from if SUBMITTED else 0.0
    accepted = sum(count for _, _, count in SUBMITTED)
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "workloads": args.workloads,
        "tenants": args.tenants,
        "duration_s": args.duration,
        "completed": done,
        "submission": {
            "requests": len(SUBMITTED),
            "accepted": accepted,
            "seconds": round(answered, 2),
            "workloads_per_s": round(accepted / answered, 1) if answered else None,
            "median_request_s": round(statistics.median(e - s for s, e, _ in SUBMITTED), 2) if SUBMITTED else None,
        },
        "timeline": _timeline(submit_from, args.nodes * args.gpus, args.duration),
        "cpu": _cpu(watch.series, submit_from, idle_cpu, idle_s),
        "peaks": _peaks(watch.series),
        "tasks": {worker: _tasks(worker) for worker in ("controller", "ingest")},
        "problems": {name: _problems(name) for name in ("web", "controller", "ingest")},
        "logs": str(LOGS),
    }
    if not args.keep:
        from django.db import connections

        connections.close_all()
        _drop(database)
    print(_table(result))
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps({**result, "series": watch.series}, indent=1))


if __name__ == "__main__":
    main()
