"""The notebook proxy against going straight to Jupyter: download throughput and kernel round trips.

    .venv/bin/python bench/proxy.py [--runs 7] [--size-mb 10] [--messages 300]

It starts a real Jupyter server through the process runtime (as a notebook
on a process node runs), serves the console with `gpucloud serve` (uvicorn,
one process) on loopback, records a running notebook whose replica's
endpoint is that server, and logs a console user in. Then, interleaved so
that machine noise hits both ways alike:

- download: GET of a `--size-mb` file from Jupyter's `/files/` (streamed
  from disk), `--runs` times through the proxy and straight from Jupyter;
  the median throughput of each and their ratio (target: >= 0.5);
- kernel round trip: `execute_request` of `1+1` on one kernel's channels
  WebSocket until both its result and its `execute_reply` have come back,
  `--messages` times each way after a warm-up; p50/p99 of each and what the proxy adds at p99 (target: <= 20 ms).

Embedded mode by default (SQLite in a scratch data directory); set
DATABASE_URL to a scratch Postgres database to measure with Postgres.
Everything it starts is stopped, and the scratch directory removed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.process_user import reachable_dir  # noqa: E402 -- from this checkout (sys.path above)

SCRATCH = Path(tempfile.mkdtemp(prefix="gpucloud-bench-proxy-"))
# What the notebook server's user reaches (it is not root's when the bench runs as root): tests/process_user.py.
WORKLOAD_DIR = reachable_dir()
if not os.environ.get("DATABASE_URL"):
    (SCRATCH / "data").mkdir()
    os.environ["GPUCLOUD_DATA_DIR"] = str(SCRATCH / "data")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(48))

import httpx  # noqa: E402 -- after the environment is set
from websockets.sync.client import ClientConnection, connect  # noqa: E402

TOKEN = secrets.token_urlsafe(32)
FILE = "big.bin"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _setup() -> tuple[int, Any]:
    """Migrate, create a tenant with a running notebook owned by a user; return its id and the user."""
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command

    from inventory.models import Node, NodePool
    from jobs.models import Workload
    from tenants.models import Membership, Project, Tenant

    call_command("migrate", verbosity=0)
    tenant, _ = Tenant.objects.get_or_create(slug="bench-proxy", defaults={"name": "Bench proxy"})
    project, _ = Project.all_tenants.get_or_create(tenant=tenant, slug="alpha", defaults={"name": "Alpha"})
    pool, _ = NodePool.objects.get_or_create(name="bench-proxy")
    Node.objects.get_or_create(name="bench-proxy-node", defaults={"pool": pool, "runtime": "process", "state": "ready"})
    user, _ = User.objects.get_or_create(username="bench-proxy-owner")
    Membership.all_tenants.get_or_create(tenant=tenant, user=user, defaults={"role": "member"})
    workload = Workload.all_tenants.create(
        tenant=tenant,
        project=project,
        owner=user,
        pool=pool,
        kind="notebook",
        name="bench",
        image="jupyter",
        state="running",
        session_secret=TOKEN,
        service_port=8888,
    )
    return workload.pk, user


def _record_endpoint(workload_id: int, endpoint: str) -> None:
    from inventory.models import Node
    from jobs.models import Replica, Workload
    from jobs.services.execution import container_name

    workload = Workload.all_tenants.get(pk=workload_id)
    node = Node.objects.get(name="bench-proxy-node")
    Replica.all_tenants.create(
        tenant_id=workload.tenant_id,
        workload=workload,
        attempt=workload.attempt,
        index=0,
        node=node,
        name=container_name(workload_id, 0, workload.attempt),
        endpoint=endpoint,
        state="running",
    )


def _session_cookie(user: Any) -> str:
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def _start_jupyter(workload_id: int, size_mb: int) -> tuple[Any, dict[str, Any]]:
    from inventory.drivers.base import WorkloadSpec
    from inventory.drivers.process import ProcessRuntime
    from jobs.services.execution import container_name
    from tests.process_user import workload_python

    # As root the runtime runs the server as an unprivileged user (tests/process_user.py): its interpreter,
    # files and work directory must be reachable for that user.
    root = WORKLOAD_DIR / "notebooks"
    root.mkdir(mode=0o755)
    (root / FILE).write_bytes(os.urandom(size_mb * 1024 * 1024))
    (root / FILE).chmod(0o644)
    agent = WORKLOAD_DIR / "agent"
    agent.mkdir(mode=0o711)
    runtime = ProcessRuntime(agent, enabled=True)
    command = [
        *workload_python(),
        "-m",
        "jupyter_server",
        f"--ServerApp.base_url=/notebooks/{workload_id}/",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root}",
        "--no-browser",
        "--allow-root",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        "--ServerApp.log_level=WARN",
    ]
    spec = WorkloadSpec(
        name=container_name(workload_id, 0, 1),
        workload_id=str(workload_id),
        tenant="bench-proxy",
        attempt=1,
        image="jupyter",
        command=command,
        env={"JUPYTER_TOKEN": TOKEN},
        service_port=8888,
        service_port_env="JUPYTER_PORT",
    )
    handle = runtime.start(spec)
    _wait(f"{handle['endpoint']}/notebooks/{workload_id}/api/status", {"Authorization": f"token {TOKEN}"})
    return runtime, handle


def _serve(port: int) -> subprocess.Popen[bytes]:
    """Start `gpucloud serve` on `port` (notebooks on the next port, their own origin); return once it answers."""
    command = [sys.executable, "-c", "from gpucloud.cli import main; main()", "serve", "--port", str(port)]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(f"http://127.0.0.1:{port}/healthz", {})
    return server


def _enter(console: str, cookie: str, workload_id: int) -> tuple[str, str]:
    """Enter the notebook through the console's hand-off; return (the notebook origin, its cookie header)."""
    from notebook_start import hand_off

    entered = hand_off(console, cookie, workload_id)
    if entered is None:
        raise SystemExit(f"the console hands over no notebook {workload_id}")
    _wait(f"{entered[0]}/notebooks/{workload_id}/api/status", {"Cookie": entered[1]})
    return entered


def _wait(url: str, headers: dict[str, str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, headers=headers, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout:g} s")


def _download(client: httpx.Client, url: str, headers: dict[str, str], size: int) -> float:
    """Return the MB/s of one streamed download of `url` (checking every byte arrived)."""
    started = time.perf_counter()
    received = 0
    with client.stream("GET", url, headers=headers) as response:
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}")
        for chunk in response.iter_raw(256 * 1024):
            received += len(chunk)
    elapsed = time.perf_counter() - started
    if received != size:
        raise SystemExit(f"{url} sent {received} bytes, not {size}")
    return size / elapsed / 1e6


def _ways(direct: str, console: str, path: str, cookie: str) -> dict[str, tuple[str, dict[str, str]]]:
    """Return the URL and headers of `path` each way: straight to Jupyter with its token, or through the proxy."""
    return {
        "direct": (direct + path, {"Authorization": f"token {TOKEN}"}),
        "proxied": (console + path, {"Cookie": cookie}),
    }


def _side_by_side(timings: dict[str, list[float]]) -> dict[str, Any]:
    """Return the percentiles of each way's timings and what the proxy adds at p50 and p99."""
    direct, proxied = _percentiles(timings["direct"]), _percentiles(timings["proxied"])
    return {
        "direct": direct,
        "proxied": proxied,
        "added_p50_ms": round(proxied["p50_ms"] - direct["p50_ms"], 2),
        "added_p99_ms": round(proxied["p99_ms"] - direct["p99_ms"], 2),
    }


def _downloads(direct: str, console: str, workload_id: int, cookie: str, size_mb: int, runs: int) -> dict[str, Any]:
    path = f"/notebooks/{workload_id}/files/{FILE}"
    size = size_mb * 1024 * 1024
    ways = _ways(direct, console, path, cookie)
    speeds: dict[str, list[float]] = {way: [] for way in ways}
    with httpx.Client(timeout=60, trust_env=False) as client:
        for run in range(runs + 1):
            for way, (url, headers) in ways.items():
                speed = _download(client, url, headers, size)
                if run:  # the first run of each way warms caches and connections
                    speeds[way].append(speed)
    direct_mb_s, proxied_mb_s = statistics.median(speeds["direct"]), statistics.median(speeds["proxied"])
    return {
        "size_mb": size_mb,
        "runs": runs,
        "direct_mb_s": round(direct_mb_s, 1),
        "proxied_mb_s": round(proxied_mb_s, 1),
        "ratio": round(proxied_mb_s / direct_mb_s, 3),
    }


def _small_requests(direct: str, console: str, workload_id: int, cookie: str, count: int) -> dict[str, Any]:
    """Return p50/p99 ms of `count` small GETs (Jupyter's status) each way: what the per-request check costs."""
    path = f"/notebooks/{workload_id}/api/status"
    ways = _ways(direct, console, path, cookie)
    timings: dict[str, list[float]] = {way: [] for way in ways}
    with httpx.Client(timeout=30, trust_env=False) as client:
        for run in range(count + 10):
            for way, (url, headers) in ways.items():
                started = time.perf_counter()
                if client.get(url, headers=headers).status_code != 200:
                    raise SystemExit(f"{url} did not answer 200")
                if run >= 10:
                    timings[way].append((time.perf_counter() - started) * 1000)
    return {"requests": count, **_side_by_side(timings)}


def _execute(channel: ClientConnection, session: str) -> float:
    """Return the ms from sending `1+1` until both its result (2, on iopub) and its execute_reply have come.

    Jupyter relays the kernel's channels over one socket without ordering
    them, so the reply may overtake the result.
    """
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "bench", "session": session}
    header |= {"date": datetime.now(UTC).isoformat(), "version": "5.3"}
    content = {"code": "1+1", "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
    started = time.perf_counter()
    channel.send(json.dumps(message))
    result, replied = None, False
    while result is None or not replied:
        reply = json.loads(channel.recv(timeout=30))
        if reply.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if reply["msg_type"] == "execute_result":
            result = reply["content"]["data"]["text/plain"]
        replied = replied or reply["msg_type"] == "execute_reply"
    elapsed = (time.perf_counter() - started) * 1000
    if result != "2":
        raise SystemExit(f"1+1 gave {result!r}")
    return elapsed


def _percentiles(timings: list[float]) -> dict[str, float]:
    ordered = sorted(timings)
    return {"p50_ms": round(statistics.median(ordered), 2), "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1], 2)}


def _round_trips(direct: str, console: str, workload_id: int, cookie: str, messages: int) -> dict[str, Any]:
    base = f"/notebooks/{workload_id}/api/kernels"
    with httpx.Client(timeout=60, trust_env=False) as client:
        started = client.post(direct + base, headers={"Authorization": f"token {TOKEN}"}, json={"name": "python3"})
        kernel = started.json()["id"]
    path = f"{base}/{kernel}/channels"
    direct_ws = connect(
        direct.replace("http", "ws", 1) + path, additional_headers={"Authorization": f"token {TOKEN}"}, compression=None
    )
    proxied_ws = connect(
        console.replace("http", "ws", 1) + path,
        additional_headers={"Cookie": cookie},
        origin=console,  # type: ignore[arg-type]  # Origin is a NewType of str
        compression=None,
    )
    timings: dict[str, list[float]] = {"direct": [], "proxied": []}
    with direct_ws, proxied_ws:
        channels = {"direct": direct_ws, "proxied": proxied_ws}
        for i in range(messages + 30):
            for way, channel in channels.items():
                elapsed = _execute(channel, f"bench-{way}")
                if i >= 30:  # warm-up: the kernel's first executions are slower
                    timings[way].append(elapsed)
    return {"messages": messages, **_side_by_side(timings)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--size-mb", type=int, default=10)
    parser.add_argument("--messages", type=int, default=300)
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would drown the result
    runtime = handle = server = None
    try:
        workload_id, user = _setup()
        runtime, handle = _start_jupyter(workload_id, args.size_mb)
        _record_endpoint(workload_id, handle["endpoint"])
        port = _free_port()
        server = _serve(port)
        # Through the proxy means on the notebook origin, with its own cookie from the console's hand-off.
        console, cookie = _enter(f"http://127.0.0.1:{port}", _session_cookie(user), workload_id)
        from django.db import connection

        results = {
            "database": connection.vendor,
            "download": _downloads(handle["endpoint"], console, workload_id, cookie, args.size_mb, args.runs),
            "small_request": _small_requests(handle["endpoint"], console, workload_id, cookie, 200),
            "kernel_round_trip": _round_trips(handle["endpoint"], console, workload_id, cookie, args.messages),
            "targets": {"download_ratio_min": 0.5, "added_p99_ms_max": 20},
        }
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=20)
        if runtime is not None and handle is not None:
            runtime.remove(handle, timeout=10)
        shutil.rmtree(SCRATCH, ignore_errors=True)
        shutil.rmtree(WORKLOAD_DIR, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
