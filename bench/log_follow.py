"""Live log followers: 50 workloads writing 200 lines/s each, one browser following each; lost lines and latency.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud_bench REDIS_URL=redis://127.0.0.1:6379/1 \
        .venv/bin/python bench/log_follow.py [--workloads 50] [--rate 200] [--seconds 60] [--layer pubsub|core]

Both must be scratch: it empties the broker's task queues first. It
migrates the scratch database in DATABASE_URL, creates a tenant with
`--workloads` running workloads (one replica each) and one member per
follower, and starts one web process (uvicorn, as `gpucloud serve`) and one
controller (`gpucloud worker`, as a deployment runs it) that stores the
batches. A client process opens one WebSocket per workload on
`/ws/workloads/<id>/logs/`, authenticating with the member's API token as a
subprotocol. This process then plays the node agents: every workload writes
`--rate` lines a second, eight workloads run on each node, and the output
is shipped as the agent's executor ships it: a batch `BATCH_SECONDS` after
its first line, chained by cursor, and each node's ready batches together
as one Celery task `jobs.ingest_log_batches` on the control queue every
`SHIP_SECONDS`.

Reported: lines written, lines received, lost lines, gaps and duplicates in
the sequence numbers each client saw, and the delay from a line's timestamp
(when the program wrote it) to its arrival in the client: p50, p99, max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _proc import cpu_seconds, oldest_named

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
CONNECT_TIMEOUT = 60.0
WORKLOADS_PER_NODE = 8  # one single-GPU workload per GPU of an 8-GPU node

DRAIN_SECONDS = 10.0


def _setup(workloads: int) -> list[tuple[int, str]]:
    """Create the bench tenant's running workloads and followers; return (workload id, follower token) pairs."""
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection

    from inventory.models import Node, NodePool
    from jobs.models import Replica, Workload
    from tenants.context import Actor
    from tenants.models import Membership, Project, Tenant
    from tenants.services.tokens import create_token

    if connection.vendor != "postgresql" or not os.environ.get("REDIS_URL"):
        raise SystemExit("Set DATABASE_URL to a scratch Postgres database and REDIS_URL: this measures both.")
    call_command("migrate", verbosity=0)
    from gpucloud.celery import app

    # Batches an interrupted run left on the ingest queue would be stored ahead of this run's.
    app.control.purge()
    with app.connection_for_write() as broker:
        broker.default_channel.queue_purge("ingest")  # type: ignore[attr-defined]  # kombu's virtual channel
    # A previous run's workloads protect their project, tenant and owner: remove them first.
    Workload.all_tenants.filter(tenant__slug="bench-logs").delete()
    Project.all_tenants.filter(tenant__slug="bench-logs").delete()
    Tenant.objects.filter(slug="bench-logs").delete()
    User.objects.filter(username__startswith="bench-logs-").delete()
    pool, _ = NodePool.objects.get_or_create(name="bench-logs")
    tenant = Tenant.objects.create(slug="bench-logs", name="Bench logs")
    project = Project.all_tenants.create(tenant=tenant, slug="bench", name="Bench")
    owner = User.objects.create_user("bench-logs-owner")
    Membership.all_tenants.create(tenant=tenant, user=owner, role="admin")
    pairs = []
    for i in range(workloads):
        name = f"bench-logs-node-{i // WORKLOADS_PER_NODE}"
        node, _ = Node.objects.get_or_create(name=name, defaults={"pool": pool, "runtime": "docker"})
        workload = Workload.all_tenants.create(
            tenant=tenant,
            project=project,
            owner=owner,
            kind="job",
            name=f"writer-{i}",
            image="busybox",
            pool=pool,
            command=["sh"],
            state="running",
            attempt=1,
        )
        Replica.all_tenants.create(
            tenant=tenant, workload=workload, attempt=1, index=0, node=node, name=f"bench-w{workload.pk}"
        )
        follower = User.objects.create_user(f"bench-logs-{i:03d}")
        Membership.all_tenants.create(tenant=tenant, user=follower, role="member")
        issued = create_token(actor=Actor(user=follower), tenant=tenant, name="bench", role="member", expires_in_days=1)
        secret = issued.secret
        pairs.append((workload.pk, secret))
    return pairs


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(port: int, layer: str) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """Start one web process and one controller, as a deployment does."""
    env = {**os.environ, "LIVE_CHANNEL_LAYER": layer, "LOG_LEVEL": "WARNING"}
    code = (
        "import uvicorn; uvicorn.run('gpucloud.asgi:application', host='127.0.0.1', "
        f"port={port}, lifespan='off', log_level='warning', access_log=False)"
    )
    web = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)
    worker = [sys.executable, "-c", "from gpucloud.cli import main; main()", "worker", "--loglevel", "WARNING"]
    controller = subprocess.Popen(worker, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return web, controller
        time.sleep(0.2)
    raise SystemExit("the web process did not start listening")


# --- followers (a process of their own) ---------------------------------------------------------------


async def _follow(url: str, token: str, state: dict[str, Any]) -> None:
    from websockets.asyncio.client import connect
    from websockets.typing import Subprotocol

    seen: dict[str, int] = {"last": 0, "count": 0, "gaps": 0, "duplicates": 0}
    state["followers"].append(seen)
    async with connect(
        url, subprotocols=[Subprotocol("gpucloud.v1"), Subprotocol(f"gpucloud.bearer.{token}")], max_size=2**24
    ) as socket_:
        async for raw in socket_:
            received = time.time()
            message = json.loads(raw)
            if message.get("type") != "lines":
                continue
            if message.get("snapshot"):
                state["ready"] += 1
            for seq, stamp, _stream, _text, _attempt, _replica in message["lines"]:
                last = seen["last"]
                if seq <= last:
                    seen["duplicates"] += 1
                    continue
                if seq != last + 1:
                    seen["gaps"] += seq - last - 1
                seen["last"] = seq
                seen["count"] += 1
                state["latencies"].append(received - datetime.fromisoformat(stamp).timestamp())


async def _followers_main(port: int, pairs: list[tuple[int, str]], work: Path) -> None:
    state: dict[str, Any] = {"ready": 0, "latencies": [], "followers": [], "errors": []}

    async def one(workload_id: int, token: str) -> None:
        try:
            await _follow(f"ws://127.0.0.1:{port}/ws/workloads/{workload_id}/logs/?after=0", token, state)
        except Exception as error:  # a bench counts every way a follower can end
            state["errors"].append(f"{type(error).__name__}: {error}"[:200])

    tasks = [asyncio.create_task(one(workload_id, token)) for workload_id, token in pairs]
    while not (work / "done").exists():
        (work / "ready").write_text(str(state["ready"]))
        await asyncio.sleep(0.2)
    (work / "followers.json").write_text(json.dumps(state))
    for task in tasks:
        task.cancel()


# --- the agents (this process) ------------------------------------------------------------------------


def _batch(workload_id: int, due: float, per_batch: int, counters: dict[int, int], cursors: dict[int, str]) -> dict:
    """Return the workload's chained batch due at `due`: its lines were written over the BATCH_SECONDS before."""
    from inventory.agent.executor import BATCH_SECONDS

    lines = []
    for i in range(per_batch):
        stamp = datetime.fromtimestamp(due - BATCH_SECONDS + (i + 1) * BATCH_SECONDS / per_batch, UTC)
        counters[workload_id] += 1
        text = f"step {counters[workload_id]:08d} loss=0.{counters[workload_id] % 9973:04d} " + "x" * 60
        lines.append([stamp.isoformat(), "stdout", text])
    since, cursors[workload_id] = cursors[workload_id], f"bench:{counters[workload_id]}"
    ids = {"workload_id": workload_id, "attempt": 1, "replica": 0}
    return {**ids, "since": since, "cursor": cursors[workload_id], "lines": lines}


def _write(nodes: list[list[int]], rate: int, seconds: float) -> int:
    """Ship every workload's output as the agents do for `seconds`; return the lines written.

    Each workload's watcher closes a batch BATCH_SECONDS after its first
    line; each node's outbox sends the batches that are ready as one
    `jobs.ingest_log_batches` message every SHIP_SECONDS (the busy case:
    a quiet node's outbox sends at once).
    """
    from common.protocol.messages import LogBatches
    from gpucloud.celery import app
    from inventory.agent.executor import BATCH_SECONDS, SHIP_SECONDS

    per_batch = max(1, round(rate * BATCH_SECONDS))
    workloads = [w for node in nodes for w in node]
    cursors = dict.fromkeys(workloads, "")
    counters = dict.fromkeys(workloads, 0)
    start = time.time()
    due = {w: start + BATCH_SECONDS * (1 + i / len(workloads)) for i, w in enumerate(workloads)}
    ship = [start + SHIP_SECONDS * (1 + k / len(nodes)) for k in range(len(nodes))]
    written = 0
    while time.time() - start < seconds:
        k = min(range(len(nodes)), key=ship.__getitem__)
        delay = ship[k] - time.time()
        if delay > 0:
            time.sleep(delay)
        batches = []
        for w in nodes[k]:
            while due[w] <= ship[k]:
                batches.append(_batch(w, due[w], per_batch, counters, cursors))
                due[w] += BATCH_SECONDS
        if batches:
            app.send_task(LogBatches.TASK, kwargs={"batches": batches}, queue="ingest")
            written += per_batch * len(batches)
        ship[k] += SHIP_SECONDS
    return written


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def _run(args: argparse.Namespace, pairs: list[tuple[int, str]]) -> dict[str, Any]:
    port = _free_port()
    web, controller = _start(port, args.layer)
    work = Path(tempfile.mkdtemp(prefix="gpucloud-logs-"))
    (work / "pairs.json").write_text(json.dumps(pairs))
    followers = subprocess.Popen(
        [sys.executable, __file__, "--role", "followers", "--port", str(port), "--work", str(work)], cwd=ROOT
    )
    try:
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while time.monotonic() < deadline:
            ready = int((work / "ready").read_text() or 0) if (work / "ready").exists() else 0
            if ready >= len(pairs):
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"only {ready} of {len(pairs)} followers connected within {CONNECT_TIMEOUT}s")
        # Postgres and Redis share the machine's cores with the console: their CPU is reported too.
        others = {
            "followers": followers.pid,
            "postgres": oldest_named("postgres"),
            "redis": oldest_named("redis-server"),
        }
        others_cpu = {name: cpu_seconds(pid) for name, pid in others.items() if pid}
        web_cpu, controller_cpu, started = cpu_seconds(web.pid), cpu_seconds(controller.pid), time.time()
        writer_cpu = time.process_time()
        workload_ids = [workload_id for workload_id, _ in pairs]
        nodes = [workload_ids[i : i + WORKLOADS_PER_NODE] for i in range(0, len(workload_ids), WORKLOADS_PER_NODE)]
        written = _write(nodes, args.rate, args.seconds)
        elapsed = time.time() - started
        web_cores = (cpu_seconds(web.pid) - web_cpu) / elapsed
        controller_cores = (cpu_seconds(controller.pid) - controller_cpu) / elapsed
        cores = {name: (cpu_seconds(others[name] or 0) - before) / elapsed for name, before in others_cpu.items()}
        cores["agents (this process)"] = (time.process_time() - writer_cpu) / elapsed
        time.sleep(DRAIN_SECONDS)
        (work / "done").write_text("")
        followers.wait(timeout=60)
        state = json.loads((work / "followers.json").read_text())
    finally:
        for process in (followers, web, controller):
            if process.poll() is None:
                process.send_signal(signal.SIGINT if process is not followers else signal.SIGKILL)
        for process in (web, controller):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
    received = sum(follower["count"] for follower in state["followers"])
    latencies = state["latencies"]
    return {
        "layer": args.layer,
        "workloads": len(pairs),
        "lines_per_second_each": args.rate,
        "seconds": args.seconds,
        "lines_written": written,
        "lines_received": received,
        "lost": written - received,
        "gaps": sum(follower["gaps"] for follower in state["followers"]),
        "duplicates": sum(follower["duplicates"] for follower in state["followers"]),
        "latency_ms_p50": round(1000 * statistics.median(latencies), 1) if latencies else None,
        "latency_ms_p99": round(1000 * _percentile(latencies, 0.99), 1),
        "latency_ms_max": round(1000 * max(latencies), 1) if latencies else None,
        "web_cpu_cores": round(web_cores, 2),
        "controller_cpu_cores": round(controller_cores, 2),
        "other_cpu_cores": {name: round(value, 2) for name, value in cores.items()},
        "follower_errors": state["errors"][:5],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=50)
    parser.add_argument("--rate", type=int, default=200, help="lines per second per workload")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--layer", choices=["pubsub", "core"], default="pubsub")
    parser.add_argument("--role", choices=["bench", "followers"], default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "followers":
        pairs = [(int(w), str(t)) for w, t in json.loads((args.work / "pairs.json").read_text())]
        asyncio.run(_followers_main(args.port, pairs, args.work))
        return
    os.environ["LIVE_CHANNEL_LAYER"] = args.layer
    pairs = _setup(args.workloads)
    print(json.dumps({"bench": "log_follow", **_run(args, pairs)}, indent=2))


if __name__ == "__main__":
    main()
