"""The agent gateway under a fleet of joined agents: one web process, N agents long-polling and reporting.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud_gateway REDIS_URL=redis://127.0.0.1:6379/6 \\
    SECRET_KEY=$(openssl rand -hex 40) .venv/bin/python bench/agent_gateway.py [--nodes 1000] [--interval 5] \\
        [--seconds 60]

It migrates the scratch database, makes `--nodes` ready nodes with 8 GPUs,
joins each through the real services (a join token redeemed for a node
credential), and starts one web process as deployments do (`gpucloud
serve`). This process then plays every agent over HTTP on loopback, as the
remote agent does: each keeps a command long-poll open (`wait=20`) and
posts a heartbeat report with 8 GPU samples every `--interval` seconds,
spread evenly. Over the measured window it reports the web process's CPU
(cores), its resident memory and thread count with every poll open, and the
report round trip (p50/p95/max) and failures. Nothing consumes the
heartbeat mailbox: the controller's cost of applying heartbeats is
bench/heartbeats.py's.
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
import time
from pathlib import Path
from typing import Any

from _fleet import fleet
from _proc import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
WARMUP = 25.0  # every poll is open by then
POLL_WAIT = 20


def _join_all(nodes: int) -> dict[str, str]:
    """Create the fleet and join every node; return each node's credential by node name."""
    from django.contrib.auth.models import User

    from inventory.models import NodeCredential, NodeJoinToken
    from inventory.services.agents import issue_join_token, redeem_join_token
    from tenants.context import Actor

    created, _ = fleet("bench-gateway", "gw", nodes, 8, lambda node, g: f"GPU-{node}-{g}")
    operator, _ = User.objects.get_or_create(username="bench-operator", defaults={"is_staff": True})
    NodeJoinToken.objects.filter(node__in=created).delete()
    NodeCredential.objects.filter(node__in=created).delete()
    credentials = {}
    for node in created:
        token = issue_join_token(actor=Actor(user=operator), node=node).secret
        credentials[node.name] = redeem_join_token(secret=token, host=f"host-{node.name}").secret
    return credentials


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _web(port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", "from gpucloud.cli import main; main()", "serve", "--port", str(port)]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _status(pid: int) -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"rss_mb": int(fields["VmRSS"].split()[0]) // 1024, "threads": int(fields["Threads"])}


class Fleet:
    """Every agent's poll loop and report loop, on one asyncio loop with one HTTP connection pool."""

    def __init__(self, url: str, credentials: dict[str, str], interval: float) -> None:
        self.url, self.credentials, self.interval = url, credentials, interval
        self.round_trips: list[float] = []
        self.failures = 0
        self.polls_answered = 0
        self.measuring = False

    async def poll(self, client: object, credential: str, offset: float, stop: asyncio.Event) -> None:
        import httpx

        assert isinstance(client, httpx.AsyncClient)
        headers = {"Authorization": f"Node {credential}"}
        # Agents joined at different moments: their polls are spread over the wait, not all answered together.
        await asyncio.sleep(offset)
        while not stop.is_set():
            try:
                await client.get(f"{self.url}/api/v1/agent/commands", params={"wait": POLL_WAIT}, headers=headers)
                self.polls_answered += 1
            except httpx.HTTPError:
                await asyncio.sleep(1)

    async def report(self, client: object, name: str, credential: str, offset: float, stop: asyncio.Event) -> None:
        import httpx

        assert isinstance(client, httpx.AsyncClient)
        headers = {"Authorization": f"Node {credential}"}
        await asyncio.sleep(offset)
        while not stop.is_set():
            samples = [
                {"uuid": f"GPU-{name}-{g}", "index": g, "timestamp": time.time(), "utilization_gpu": 100.0 * (g % 2)}
                for g in range(8)
            ]
            body = {
                "messages": [
                    {"kind": "heartbeat", "report": {"node": name, "sent_at": time.time(), "samples": samples}}
                ]
            }
            started = time.monotonic()
            try:
                answer = await client.post(f"{self.url}/api/v1/agent/reports", json=body, headers=headers)
                ok = answer.status_code == 200
            except httpx.HTTPError:
                ok = False
            if self.measuring:
                if ok:
                    self.round_trips.append(time.monotonic() - started)
                else:
                    self.failures += 1
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def run(self, web_pid: int, seconds: float) -> dict[str, object]:
        import httpx

        stop = asyncio.Event()
        limits = httpx.Limits(max_connections=2 * len(self.credentials) + 10, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            names = list(self.credentials)
            step = self.interval / len(names)
            spread = POLL_WAIT / len(names)
            tasks = [
                asyncio.create_task(self.poll(client, self.credentials[n], i * spread, stop))
                for i, n in enumerate(names)
            ]
            tasks += [
                asyncio.create_task(self.report(client, n, self.credentials[n], i * step, stop))
                for i, n in enumerate(names)
            ]
            await asyncio.sleep(WARMUP)
            self.measuring = True
            cpu_before, started = cpu_seconds(web_pid), time.monotonic()
            await asyncio.sleep(seconds / 2)
            status = _status(web_pid)
            await asyncio.sleep(seconds / 2)
            cores = (cpu_seconds(web_pid) - cpu_before) / (time.monotonic() - started)
            self.measuring = False
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        trips = sorted(self.round_trips)
        return {
            "nodes": len(names),
            "interval_s": self.interval,
            "reports_per_s": round(len(trips) / seconds, 1),
            "web_cores": round(cores, 2),
            "web_rss_mb": status["rss_mb"],
            "web_threads": status["threads"],
            "report_p50_ms": round(1000 * statistics.median(trips), 1) if trips else None,
            "report_p95_ms": round(1000 * trips[int(0.95 * (len(trips) - 1))], 1) if trips else None,
            "report_max_ms": round(1000 * trips[-1], 1) if trips else None,
            "report_failures": self.failures,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between two reports of one agent")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window, after a 25 s warm-up")
    args = parser.parse_args()
    import logging

    import django

    django.setup()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    credentials = _join_all(args.nodes)
    port = _free_port()
    web = _web(port)
    try:
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code < 500:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        result = asyncio.run(Fleet(f"http://127.0.0.1:{port}", credentials, args.interval).run(web.pid, args.seconds))
    finally:
        web.send_signal(signal.SIGTERM)
        try:
            web.wait(timeout=20)
        except subprocess.TimeoutExpired:
            web.kill()
    from django.conf import settings

    from gpucloud.celery import app
    from inventory.mailbox import QUEUE

    with app.connection_for_write() as connection:  # the heartbeats nobody applied
        channel: Any = connection.default_channel
        channel.queue_purge(QUEUE)
    print(json.dumps(result, indent=2))
    print(f"(Redis {settings.REDIS_URL}, web on 127.0.0.1:{port})")


if __name__ == "__main__":
    main()
