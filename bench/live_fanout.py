"""Hundreds of browsers watching GPU nodes live: sample-to-client latency, drops, web process CPU and memory.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud_bench REDIS_URL=redis://127.0.0.1:6379/1 \
        .venv/bin/python bench/live_fanout.py [--clients 500] [--nodes 500] [--gpus 64] [--seconds 60] \
        [--layer pubsub|core|both]

It migrates the scratch database in DATABASE_URL, registers `--nodes` nodes
of `--gpus` GPUs and one operator account (with an API token) per client,
and starts one web process as a deployment does (uvicorn serving
`gpucloud.asgi:application`, one process). A client process opens
`--clients` WebSocket connections to `/ws/nodes/<name>/metrics/`, spread
evenly over the nodes (500 clients on 500 nodes: every client watches a
node of its own; `--nodes 1`: all watch the same node), authenticating
with the token as a subprotocol, as the protocol allows for non-browser
clients. This process plays the agents: every node publishes one sample of
each of its GPUs per second on the live channel layer, through the agent's
own transport function, spread evenly over the second.

Measured over `--seconds` after every client received its first message:
the delay from a sample's timestamp to its arrival at the client (p50, p99,
max), messages published for the watched nodes against messages received
(dropped = expected - received), and the web process's CPU (cores) and
peak resident memory. `--layer both` runs the stock channel layer
(`RedisChannelLayer`: one copy of each message per consumer through Redis
lists) and the pub/sub layer the console uses by default side by side.
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
from pathlib import Path
from typing import Any

from _fleet import fleet
from _proc import cpu_seconds, rss_mb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
CONNECT_TIMEOUT = 120.0


def _setup(nodes: int, gpus: int, clients: int) -> tuple[list[str], list[str]]:
    """Create (or reset) the bench nodes, GPUs and operators; return node names and one token per client."""
    created, _ = fleet("bench-live", "live", nodes, gpus, lambda node, g: f"GPU-{node}-{g:02d}")
    from django.contrib.auth.models import User

    from tenants.context import Actor
    from tenants.services.tokens import create_token

    User.objects.filter(username__startswith="bench-live-").delete()
    users = User.objects.bulk_create(User(username=f"bench-live-{i:04d}", is_staff=True) for i in range(clients))
    # Through the token service, as a user creating a token in the console does.
    issued = [
        create_token(actor=Actor(user=user), tenant=None, name="bench", role="operator", expires_in_days=1)
        for user in users
    ]
    secrets_by_user = [token.secret for token in issued]
    return [node.name for node in created], secrets_by_user


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _web(port: int, layer: str) -> subprocess.Popen[bytes]:
    """Start one web process the way `gpucloud serve` does."""
    env = {**os.environ, "LIVE_CHANNEL_LAYER": layer, "LOG_LEVEL": "WARNING"}
    code = (
        "import uvicorn; uvicorn.run('gpucloud.asgi:application', host='127.0.0.1', "
        f"port={port}, lifespan='off', log_level='warning', access_log=False)"
    )
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)


def _wait_listening(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit("the web process did not start listening")


# --- the clients (a process of their own) ------------------------------------------------------------


async def _client(node: str, url: str, token: str, state: dict[str, Any], window: dict[str, float]) -> None:
    from websockets.asyncio.client import connect
    from websockets.typing import Subprotocol

    async with connect(
        url, subprotocols=[Subprotocol("gpucloud.v1"), Subprotocol(f"gpucloud.bearer.{token}")], max_size=2**24
    ) as socket_:
        state["connected"] += 1
        first = True
        seen: set[float] = set()
        async for raw in socket_:
            received = time.time()
            message = json.loads(raw)
            if message.get("type") != "gpus":
                continue
            if first:
                state["ready"] += 1
                first = False
            at = float(message["at"])
            if window["start"] <= at < window["end"]:
                if at in seen:
                    state["duplicates"] += 1
                    continue
                seen.add(at)
                state["arrivals"].setdefault(node, []).append(at)
                state["latencies"].append(received - at)
                state["received"] += 1


async def _clients_main(port: int, assignments: list[tuple[str, str]], out: Path, control: Path) -> None:
    state: dict[str, Any] = {
        "connected": 0,
        "ready": 0,
        "latencies": [],
        "received": 0,
        "duplicates": 0,
        "errors": [],
        "arrivals": {},
    }
    window = {"start": float("inf"), "end": float("inf")}

    async def one(node: str, token: str) -> None:
        try:
            await _client(node, f"ws://127.0.0.1:{port}/ws/nodes/{node}/metrics/", token, state, window)
        except Exception as error:  # a bench counts every way a client can end
            state["errors"].append(f"{type(error).__name__}: {error}"[:200])

    tasks = []
    for node, token in assignments:
        tasks.append(asyncio.create_task(one(node, token)))
        await asyncio.sleep(0.005)  # do not open hundreds of handshakes in the same millisecond
    while not control.exists():
        (out.with_suffix(".ready")).write_text(str(state["ready"]))
        await asyncio.sleep(0.5)
    window.update(json.loads(control.read_text()))
    await asyncio.sleep(max(0.0, window["end"] - time.time()) + 3.0)  # let the last window messages arrive
    out.write_text(
        json.dumps(
            {
                key: state[key]
                for key in ("connected", "ready", "latencies", "received", "duplicates", "errors", "arrivals")
            }
        )
    )
    for task in tasks:
        task.cancel()


# --- the agents (this process) ------------------------------------------------------------------------


def _samples(node: str, gpus: int, at: float, tick: int) -> list[dict[str, Any]]:
    return [
        {
            "uuid": f"GPU-{node}-{g:02d}",
            "index": g,
            "timestamp": at,
            "utilization_gpu": float((tick * 7 + g * 13) % 101),
            "utilization_memory": 20.0,
            "memory_used_mib": 40_000 + g,
            "memory_total_mib": 81_559,
            "temperature_c": 55.0,
            "power_w": 350.0,
            "sm_clock_mhz": 1980,
            "ecc_corrected": 0,
            "ecc_uncorrected": 0,
            "xid_events": [],
            "processes": [],
            "lost": False,
        }
        for g in range(gpus)
    ]


def _publish_for(nodes: list[str], gpus: int, until: float, published: dict[str, list[float]]) -> None:
    """Publish one sample per GPU per second for every node, spread evenly, until `until`.

    Through the agent's own `publish_samples` (which queues to the process's
    live-layer sender), as each node's agent does once a second.
    """
    from inventory.agent.reporter import node_gpu_group
    from inventory.agent.transport import publish_samples

    spacing = 1.0 / max(len(nodes), 1)
    tick = 0
    start = time.time()
    stop = Path(os.environ["BENCH_WORK"]) / "stop"
    while time.time() < until and not stop.exists():
        for offset, node in enumerate(nodes):
            delay = start + tick + offset * spacing - time.time()
            if delay > 0:
                time.sleep(delay)
            at = time.time()
            publish_samples(node_gpu_group(node), _samples(node, gpus, at, tick))
            published[node].append(at)
        tick += 1


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def _run(layer: str, args: argparse.Namespace, nodes: list[str], tokens: list[str]) -> dict[str, Any]:
    port = _free_port()
    web = _web(port, layer)
    work = Path(tempfile.mkdtemp(prefix="gpucloud-live-"))
    out, control = work / "clients.json", work / "window.json"
    assignments = [(nodes[i % len(nodes)], tokens[i]) for i in range(args.clients)]
    (work / "assignments.json").write_text(json.dumps(assignments))
    clients = agents = None
    try:
        _wait_listening(port)
        clients = subprocess.Popen(
            [sys.executable, __file__, "--role", "clients", "--port", str(port), "--work", str(work)], cwd=ROOT
        )
        (work / "watched.json").write_text(json.dumps(sorted({node for node, _ in assignments})))
        horizon = time.time() + CONNECT_TIMEOUT + args.seconds
        agent_args = ["--role", "agents", "--gpus", str(args.gpus), "--work", str(work), "--until", str(horizon)]
        agents = subprocess.Popen(
            [sys.executable, __file__, *agent_args],
            cwd=ROOT,
            env={**os.environ, "LIVE_CHANNEL_LAYER": layer, "LOG_LEVEL": "WARNING"},
        )
        deadline = time.monotonic() + CONNECT_TIMEOUT
        ready_file, ready = out.with_suffix(".ready"), 0
        while time.monotonic() < deadline:
            ready = int(ready_file.read_text() or 0) if ready_file.exists() else 0
            if ready >= args.clients:
                break
            time.sleep(0.5)
        # A layer that cannot keep up leaves clients waiting: measure with those that got through, and say so.
        # The window opens in two seconds: the clients poll for it twice a second.
        window = {"start": time.time() + 2.0, "end": time.time() + 2.0 + args.seconds}
        control.write_text(json.dumps(window))
        time.sleep(max(0.0, window["start"] - time.time()))
        cpu_before, started = cpu_seconds(web.pid), time.time()
        peak_rss = 0.0
        while time.time() < window["end"]:
            peak_rss = max(peak_rss, rss_mb(web.pid))
            time.sleep(1.0)
        web_cores = (cpu_seconds(web.pid) - cpu_before) / (time.time() - started)
        clients.wait(timeout=60)
        result = json.loads(out.read_text())
        (work / "stop").write_text("")
        agents.wait(timeout=30)
        published = json.loads((work / "published.json").read_text())
    finally:
        if agents is not None and agents.poll() is None:
            agents.kill()
        if clients is not None and clients.poll() is None:
            clients.kill()
        web.send_signal(signal.SIGINT)
        try:
            web.wait(timeout=20)
        except subprocess.TimeoutExpired:
            web.kill()
    in_window = {node: {at for at in ats if window["start"] <= at < window["end"]} for node, ats in published.items()}
    arrived: dict[str, list[float]] = result["arrivals"]
    watchers = {node: sum(1 for watched, _ in assignments if watched == node) for node in in_window}
    expected = sum(len(in_window[node]) * watchers[node] for node in in_window)
    # Every sample published in the window must reach every watcher of its node: count what did not,
    # and anything that arrived without having been published in the window.
    missing = sum(
        max(0, len(in_window[node]) * watchers[node] - len([a for a in arrived.get(node, []) if a in in_window[node]]))
        for node in in_window
    )
    unexpected = sum(1 for node, ats in arrived.items() for at in ats if at not in in_window.get(node, set()))
    latencies = result["latencies"]
    return {
        "layer": layer,
        "clients": args.clients,
        "nodes_watched": len(in_window),
        "gpus_per_node": args.gpus,
        "seconds": args.seconds,
        "clients_receiving_at_start": ready,
        "messages_expected": expected,
        "messages_received": result["received"],
        "dropped": missing,
        "unexpected": unexpected,
        "duplicates": result["duplicates"],
        "latency_ms_p50": round(1000 * statistics.median(latencies), 1) if latencies else None,
        "latency_ms_p99": round(1000 * _percentile(latencies, 0.99), 1),
        "latency_ms_max": round(1000 * max(latencies), 1) if latencies else None,
        "web_cpu_cores": round(web_cores, 2),
        "web_peak_rss_mb": round(peak_rss, 1),
        "client_errors": result["errors"][:5],
    }


def _agents_main(work: Path, gpus: int, until: float) -> None:
    """Publish for the watched nodes until `until`, then write what was published when."""
    import django

    django.setup()
    nodes = json.loads((work / "watched.json").read_text())
    published: dict[str, list[float]] = {node: [] for node in nodes}
    _publish_for(nodes, gpus, until, published)
    (work / "published.json").write_text(json.dumps(published))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--layer", choices=["pubsub", "core", "both"], default="both")
    parser.add_argument("--role", choices=["bench", "clients", "agents"], default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--until", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "clients":
        assignments = [tuple(pair) for pair in json.loads((args.work / "assignments.json").read_text())]
        asyncio.run(_clients_main(args.port, assignments, args.work / "clients.json", args.work / "window.json"))
        return
    if args.role == "agents":
        os.environ["BENCH_WORK"] = str(args.work)
        _agents_main(args.work, args.gpus, args.until)
        return
    nodes, tokens = _setup(args.nodes, args.gpus, args.clients)
    layers = ["core", "pubsub"] if args.layer == "both" else [args.layer]
    results = []
    for layer in layers:
        results.append(_run(layer, args, nodes, tokens))
    print(json.dumps({"bench": "live_fanout", "runs": results}, indent=2))


if __name__ == "__main__":
    main()
