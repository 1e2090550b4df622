"""Scale: simulated hosts through the real web, controller and ingest worker, on Postgres and Redis.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud_scale REDIS_URL=redis://127.0.0.1:6379/5 \
    SECRET_KEY=$(openssl rand -hex 40) .venv/bin/python bench/fleet_scale.py [--nodes 1000] [--gpus 8] \
        [--workloads 20000] [--tenants 10] [--duration 30] [--clients 4] [--batch 1000] [--keep] \
        [--kill-controller SECONDS [--down 10]]

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

`--kill-controller S` kills the controller's whole process tree (worker,
its pool processes and beat) with SIGKILL S seconds after the first
submission, as a host crash would, and starts it again `--down` seconds
later: every workload must still succeed (`not_succeeded` lists any that
did not, by state and reason).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from _fleet import fleet
from _scale_watch import Watch, cpu, peaks, problems, tasks
from list_projects import _free_port, _listening

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
POOL = "scale"
IMAGE = "registry.example.com/train:1"
LOGS = Path("/tmp/gpucloud-fleet-scale")  # noqa: S108 -- the processes' logs, kept for a look after a run
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
        conn.execute(statement)  # a fixed statement naming the checked scratch database


def _drop(name: str) -> None:
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the fleet, tenants and tokens -------------------------------------------------------------


@dataclass(frozen=True)
class Client:
    tenant: str
    secret: str


def _setup(nodes: int, gpus: int, tenants: int) -> list[Client]:
    """Create the fleet, and `tenants` tenants sharing it; return each tenant's member token."""
    from inventory.drivers.simulated import simulated_uuid

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


def _start(name: str, argv: list[str], env: dict[str, str], *, again: bool = False) -> subprocess.Popen[bytes]:
    """Start a process of the deployment in a session of its own (so that a kill can take its whole tree)."""
    LOGS.mkdir(exist_ok=True)
    COMMANDS[name] = (argv, env)
    with (LOGS / f"{name}.log").open("ab" if again else "wb") as log:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


COMMANDS: dict[str, tuple[list[str], dict[str, str]]] = {}


def _kill_and_restart(
    processes: dict[str, subprocess.Popen[bytes]], name: str, after: float, down: float, fault: dict[str, Any]
) -> None:
    """kill -9 the whole process tree of `name` `after` seconds from now (a host crash: its pool processes and
    its beat go with it, unacknowledged messages stay in Redis), start it again `down` seconds later."""
    time.sleep(after)
    victim = processes[name]
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    fault["killed_at"] = time.time()
    time.sleep(down)
    argv, env = COMMANDS[name]
    processes[name] = _start(name, argv, env, again=True)
    fault["restarted_at"] = time.time()


def worker() -> None:
    """Run `gpucloud worker` as deployed, with what this bench adds to each worker process before it starts:
    the simulated runtime's default duration (FLEET_SCALE_DURATION) and Celery's line per task done, which
    the settings keep for LOG_LEVEL=DEBUG only."""
    import logging

    import django

    django.setup()
    from celery.app import trace as celery_trace

    # The runtime reads its default duration from its own module's global: the bench sets it there (a
    # private module of the driver; the package's names are copies).
    import inventory.drivers.simulated._runtime as simulated
    from gpucloud.cli import main as gpucloud

    simulated.DEFAULT_DURATION = float(os.environ.get("FLEET_SCALE_DURATION", simulated.DEFAULT_DURATION))

    # Celery logs each task done through `celery.app.trace`'s module logger, which the settings hold at
    # WARNING; a logger of the bench's own, at INFO, takes its place in the pool processes.
    tasks = logging.getLogger("fleet_scale.tasks")
    tasks.setLevel(logging.INFO)
    celery_trace.logger = tasks
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


# --- the ledger, sampled each second -------------------------------------------------------------


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
    """Sample every second until every workload ended and no allocation is held; return False on timeout
    or Ctrl+C (the figures so far are reported either way)."""
    try:
        return _sample_until_done(watch, workloads, timeout, progress)
    except KeyboardInterrupt:
        print("interrupted: reporting what happened so far", file=sys.stderr)
        return False


def _sample_until_done(watch: Watch, workloads: int, timeout: float, progress: bool) -> bool:
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


def _firsts() -> dict[str, dict[int, float]]:
    """Return, per state (scheduled, running), when each workload first entered it, from its events
    (a requeued workload is scheduled again: its row keeps only the last time)."""
    from django.db.models import Min

    from jobs.models import WorkloadEvent

    firsts: dict[str, dict[int, float]] = {"scheduled": {}, "running": {}}
    rows = (
        WorkloadEvent.all_tenants.filter(workload__pool__name=POOL, to_state__in=list(firsts))
        .values("workload_id", "to_state")
        .annotate(at=Min("created_at"))
        .order_by()
    )
    for row in rows:
        firsts[row["to_state"]][row["workload_id"]] = row["at"].timestamp()
    return firsts


def _timeline(first_submit: float, slots: int, duration: float) -> dict[str, Any]:
    """What the ledger says of every workload: fill time, throughput, latencies, GPU time held."""
    from django.db.models import F, Sum

    from jobs.models import Allocation, Workload

    rows = list(Workload.all_tenants.filter(pool__name=POOL).values_list("pk", "state", "submitted_at", "finished_at"))
    count, firsts = len(rows), _firsts()
    scheduled, running = firsts["scheduled"], firsts["running"]
    placed = sorted(scheduled.values())
    ended = sorted(r[3].timestamp() for r in rows if r[3])
    succeeded = sorted(r[3].timestamp() for r in rows if r[3] and r[1] == "succeeded")
    to_running = [running[r[0]] - r[2].timestamp() for r in rows if r[0] in running]
    launch = [at - scheduled[pk] for pk, at in running.items() if pk in scheduled]
    wave = min(count, slots)
    filled = placed[wave - 1] - first_submit if len(placed) >= wave else None
    end_to_end = ended[-1] - first_submit if ended else None
    held = Allocation.all_tenants.filter(workload__pool__name=POOL, released_at__isnull=False).aggregate(
        s=Sum(F("released_at") - F("created_at"))
    )["s"]
    held_s = held.total_seconds() if held else 0.0
    # The middle half of the successes: the steady rate (when at least half succeeded).
    mid = succeeded[len(succeeded) // 4 : 3 * len(succeeded) // 4]
    return {
        "succeeded": len(succeeded),
        "not_succeeded": _reasons(),
        "states": dict(sorted(_counts(r[1] for r in rows).items())),
        "fleet_filled_s": _seconds(filled),
        "placements_per_s_filling": round(wave / filled, 1) if filled else None,
        "all_placed_s": _seconds(placed[-1] - first_submit if len(placed) == count else None),
        "end_to_end_s": _seconds(end_to_end),
        "succeeded_per_s": round(len(succeeded) / end_to_end, 1) if end_to_end else None,
        "steady_succeeded_per_s": _rate(mid) if 2 * len(succeeded) >= count else None,
        "ideal_per_s": round(slots / duration, 1),
        "ever_running": len(running),
        "submit_to_running_p50_s": _seconds(_percentile(to_running, 0.5)),
        "submit_to_running_p95_s": _seconds(_percentile(to_running, 0.95)),
        "launch_p50_s": _seconds(_percentile(launch, 0.5)),
        "launch_p95_s": _seconds(_percentile(launch, 0.95)),
        "launch_max_s": _seconds(max(launch) if launch else None),
        "log_lines_stored": Workload.all_tenants.filter(pool__name=POOL).aggregate(n=Sum("log_seq"))["n"],
        "gpu_seconds_held": round(held_s),
        "gpu_seconds_run": round(len(succeeded) * duration),
        "gpu_held_per_success_s": round(held_s / len(succeeded), 2) if succeeded else None,
    }


def _rate(moments: list[float]) -> float | None:
    """Return events per second over sorted `moments`, or None for fewer than two."""
    return (
        round(len(moments) / (moments[-1] - moments[0]), 1) if len(moments) > 1 and moments[-1] > moments[0] else None
    )


def _reasons() -> dict[str, int]:
    """Return how many workloads ended other than succeeded (or have not ended), by state and reason code."""
    from django.db.models import Count

    from jobs.models import Workload

    rows = (
        Workload.all_tenants.filter(pool__name=POOL)
        .exclude(state="succeeded")
        .values("state", "reason_code")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {f"{row['state']} {row['reason_code']}".strip(): row["n"] for row in rows}


def _counts(values: Any) -> dict[str, int]:
    counted: dict[str, int] = defaultdict(int)
    for value in values:
        counted[value] += 1
    return counted


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
        f"end to end           {t['end_to_end_s']} s, {t['succeeded']} succeeded: {t['succeeded_per_s']}/s "
        f"(steady {t['steady_succeeded_per_s']}/s, ideal {t['ideal_per_s']}/s)",
        f"submit -> running    p50 {t['submit_to_running_p50_s']} s, p95 {t['submit_to_running_p95_s']} s",
        f"scheduled -> running p50 {t['launch_p50_s']} s, p95 {t['launch_p95_s']} s, max {t['launch_max_s']} s",
        f"GPU held / success   {t['gpu_held_per_success_s']} s for {result['duration_s']} s of run",
        f"states at the end    {t['states']}, not succeeded {t['not_succeeded']}",
        *(
            [f"controller killed    -9 at {killed['after_first_submission_s']} s, down {killed['down_s']} s"]
            if (killed := result["controller_killed"])
            else []
        ),
        "",
        f"{'component':<12}{'cpu s':>9}{'cores':>8}{'peak 5s':>9}{'idle':>8}",
    ]
    for name, figures in cpu.items():
        if name in ("machine", "others"):
            continue
        idle = figures["idle_cores"]
        lines.append(
            f"{name:<12}{figures['cpu_s']:>9}{figures['cores']:>8}{figures['peak_5s_cores']:>9}"
            f"{'' if idle is None else idle:>8}"
        )
    lines.append(
        f"machine busy {cpu['machine']['busy_cores']} cores of {os.cpu_count()} (load {cpu['machine']['load_mean']}), "
        f"of which other work {cpu['others']['cores']}"
    )
    lines.append("")
    lines.append(", ".join(f"{k} {v}" for k, v in result["peaks"].items()))
    for worker in ("controller", "ingest"):
        for task, stats in list(result["tasks"][worker]["run"].items())[:8]:
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
    parser.add_argument("--idle", type=float, default=35.0, help="seconds of the idle fleet measured first")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for every workload's end")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database (it is dropped otherwise)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--kill-controller",
        type=float,
        metavar="SECONDS",
        help="kill -9 the controller's process tree this long after the first submission (mid-backlog)",
    )
    parser.add_argument("--down", type=float, default=10.0, help="seconds the killed controller stays down")
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
        fault: dict[str, Any] = {}
        if args.kill_controller is not None:
            threading.Thread(
                target=_kill_and_restart,
                args=(processes, "controller", args.kill_controller, args.down, fault),
                daemon=True,
            ).start()
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
        "controller_killed": {
            "after_first_submission_s": round(fault["killed_at"] - submit_from, 1),
            "down_s": round(fault["restarted_at"] - fault["killed_at"], 1),
        }
        if "restarted_at" in fault
        else None,
        "submission": {
            "requests": len(SUBMITTED),
            "accepted": accepted,
            "seconds": round(answered, 2),
            "workloads_per_s": round(accepted / answered, 1) if answered else None,
            "median_request_s": round(statistics.median(e - s for s, e, _ in SUBMITTED), 2) if SUBMITTED else None,
        },
        "timeline": _timeline(submit_from, args.nodes * args.gpus, args.duration),
        "cpu": cpu(watch.series, submit_from, idle_cpu, idle_s),
        "peaks": peaks(watch.series),
        "tasks": {worker: tasks(LOGS / f"{worker}.log", submit_from) for worker in ("controller", "ingest")},
        "problems": {name: problems(LOGS / f"{name}.log") for name in ("web", "controller", "ingest")},
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
