"""The cluster heatmap at fleet scale: 1,000 simulated nodes of 8 GPUs, most of them held by workloads.

    .venv/bin/python bench/cluster_page.py [--nodes 1000] [--gpus 8] [--held 0.8] [--runs 15]

Without DATABASE_URL it works in a scratch SQLite database of its own (the
embedded mode, in a temporary directory); a DATABASE_URL given must be a
scratch database: its bench pools, nodes, tenants and workloads are replaced.
It registers `--nodes` ready simulated nodes in four pools, each with `--gpus`
GPUs that reported a utilization a moment ago, and running workloads of 1, 2,
4 or 8 GPUs from eight tenants holding `--held` of the GPUs (a tenth of the
held GPUs idle below the idle threshold).

Reported:
- server render time of /ops/cluster/ as an operator, through Django's
  handler in this process (p50 and max over `--runs`, after one warm-up), and
  the same page fetched over HTTP from uvicorn serving the ASGI application;
- the response's bytes, and gzip-compressed (what a compressing proxy sends);
- in Debian's Chromium (Playwright), the time to apply one live `utilization`
  message that changes every cell: the socket handler's script time (JSON
  parse included) and the time until the next frame after it was painted
  (p50 and max over `--runs`), in a 1600 x 1000 window (cells out of view
  are written when they come into view) and in a window tall enough to show
  every cell at once (all 8,000 written and painted).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
if not os.environ.get("DATABASE_URL"):
    os.environ["GPUCLOUD_DATA_DIR"] = tempfile.mkdtemp(prefix="gpucloud-bench-cluster-")

MODEL = "NVIDIA H100 80GB HBM3"
POOLS = ("bench-a", "bench-b", "bench-c", "bench-d")
TENANTS = 8
PASSWORD = "bench-cluster-page-password"  # noqa: S105 -- a scratch account of a scratch database

# One live update of every cell, timed in the page: parse and apply, then wait for the frame after it.
APPLY_UPDATE_JS = """
async (runs) => {
  const live = window.gpucloudLive.find((socket) => socket.path().includes("/ws/cluster/"));
  const nodes = [...document.querySelectorAll(".hm-node[data-node]")]
    .map((block) => [block.dataset.node, block.querySelectorAll("[data-gpu]").length]);
  const timings = [];
  for (let run = 0; run < runs; run++) {
    const message = { type: "utilization", at: Date.now() / 1000, nodes: {} };
    for (const [name, count] of nodes) message.nodes[name] = Array.from({ length: count }, () => Math.random() * 100);
    const text = JSON.stringify(message);
    await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
    const start = performance.now();
    live.onmessage(JSON.parse(text));
    const applied = performance.now();
    await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
    timings.push([applied - start, performance.now() - start]);
  }
  return { timings, cells: nodes.reduce((sum, [, count]) => sum + count, 0) };
}
"""


def _setup(nodes: int, gpus: int, held: float) -> None:
    """Migrate and (re)create the bench fleet, tenants, workloads and allocations, and the operator."""
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    # Served from the finders, as in development: no collectstatic (and no manifest) for a benchmark.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    call_command("migrate", verbosity=0)
    from django.contrib.auth.models import User

    from inventory.models import NodePool

    _clear()
    User.objects.filter(username="bench-operator").delete()
    User.objects.create_user("bench-operator", password=PASSWORD, is_staff=True, is_superuser=True)
    pools = [NodePool.objects.create(name=name) for name in POOLS]
    made = _fleet(pools, nodes, gpus)
    _workloads(made, held)


def _clear() -> None:
    from inventory.models import Node, NodePool
    from jobs.models import Allocation, Workload
    from tenants.models import Membership, Project, Tenant

    bench = {"tenant__slug__startswith": "bench-"}
    Allocation.all_tenants.filter(**bench).delete()
    Workload.all_tenants.filter(**bench).delete()
    Membership.all_tenants.filter(**bench).delete()
    Project.all_tenants.filter(**bench).delete()
    Tenant.objects.filter(slug__startswith="bench-").delete()
    Node.objects.filter(pool__name__in=POOLS).delete()
    NodePool.objects.filter(name__in=POOLS).delete()


def _fleet(pools: list[Any], nodes: int, gpus: int) -> list[Any]:
    """Create the ready simulated nodes (spread over `pools`) and their sampled GPUs; return the GPUs."""
    from django.utils import timezone

    from inventory.models import Gpu, Node

    created = Node.objects.bulk_create(
        Node(
            name=f"sim-{i:05d}",
            pool=pools[i % len(pools)],
            runtime="simulated",
            state="ready",
            simulated_gpu_count=gpus,
            simulated_gpu_model=MODEL,
            cpu_cores=128,
            memory_mib=1_024_000,
        )
        for i in range(nodes)
    )
    now = timezone.now()
    return Gpu.objects.bulk_create(
        Gpu(
            node=node,
            index=g,
            uuid=f"GPU-{node.name}-{g:02d}",
            model=MODEL,
            memory_mib=81559,
            utilization=float((i * 37 + g * 11) % 100),
            last_sample_at=now,
        )
        for i, node in enumerate(created)
        for g in range(gpus)
    )


def _workloads(gpus: list[Any], held: float) -> None:
    """Hand `held` of `gpus` to running workloads of 1, 2, 4 or 8 GPUs on one node each, round the tenants."""
    from django.contrib.auth.models import User

    from jobs.models import Allocation, Workload
    from tenants.models import Membership, Project, Tenant

    owner = User.objects.get(username="bench-operator")
    tenants = [Tenant.objects.create(slug=f"bench-{t}", name=f"Bench tenant {t}") for t in range(TENANTS)]
    projects = [Project.all_tenants.create(tenant=t, slug="train", name="Training") for t in tenants]
    Membership.all_tenants.bulk_create(Membership(tenant=t, user=owner, role="admin") for t in tenants)
    by_node: dict[int, list[Any]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node_id, []).append(gpu)
    plan: list[tuple[Any, list[Any]]] = []
    sizes = (1, 2, 4, 8)
    for n, node_gpus in enumerate(by_node.values()):
        keep = round(len(node_gpus) * held)
        taken = 0
        while taken < keep:
            size = min(sizes[(n + taken) % len(sizes)], keep - taken)
            plan.append((node_gpus[0].node, node_gpus[taken : taken + size]))
            taken += size
    workloads = Workload.all_tenants.bulk_create(
        Workload(
            tenant=tenants[i % TENANTS],
            project=projects[i % TENANTS],
            owner=owner,
            name=f"train-{i:05d}",
            image="registry.example.com/bench/train:1",
            pool=node.pool,
            gpus_per_replica=len(chosen),
            state="running",
        )
        for i, (node, chosen) in enumerate(plan)
    )
    Allocation.all_tenants.bulk_create(
        Allocation(tenant_id=w.tenant_id, workload=w, replica=0, node=node, gpu=gpu)
        for w, (node, chosen) in zip(workloads, plan, strict=True)
        for gpu in chosen
    )
    # A tenth of the held GPUs idle: they are what the page makes stand out.
    from inventory.models import Gpu

    idle = [a.gpu_id for a in Allocation.all_tenants.all().only("gpu_id")[::10]]
    Gpu.objects.filter(pk__in=idle).update(utilization=1.0)


def _render(runs: int) -> tuple[list[float], bytes, Any]:
    """Return the render times (ms), the last body, and the logged-in client."""
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client(SERVER_NAME="127.0.0.1")
    client.force_login(User.objects.get(username="bench-operator"))
    client.get("/ops/cluster/")  # warm-up: templates, URL resolver, connections
    times: list[float] = []
    body = b""
    for _ in range(runs):
        start = time.perf_counter()
        response = client.get("/ops/cluster/")
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, response.status_code
        body = response.content
    return times, body, client


@contextmanager
def _served() -> Iterator[str]:
    """Serve the console's ASGI application (static files from the finders) under uvicorn; yield its URL."""
    import uvicorn
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    from gpucloud.asgi import application

    config = uvicorn.Config(ASGIStaticFilesHandler(application), host="127.0.0.1", port=0, log_level="warning")  # type: ignore[arg-type]  # any ASGI app passes
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _fetch(url: str, cookie: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs + 1):
        request = urllib.request.Request(f"{url}/ops/cluster/", headers={"Cookie": cookie})  # noqa: S310 -- loopback
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 -- loopback
            response.read()
        times.append((time.perf_counter() - start) * 1000)
    return times[1:]


def _browser(url: str, session: tuple[str, str], runs: int) -> list[dict[str, Any]]:
    """Open the page in Chromium with the operator's session; return the in-page timings of live updates,
    in a common window and in one as tall as the page."""
    from playwright.sync_api import sync_playwright

    executable = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        raise SystemExit("No Chromium: install Debian's chromium or set CHROMIUM_PATH.")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's loop runs on this thread; the ORM is done
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        results = []
        height = 1000
        for _ in range(2):
            context = chromium.new_context(base_url=url, viewport={"width": 1600, "height": height})
            context.add_cookies([{"name": session[0], "value": session[1], "url": url}])
            page = context.new_page()
            start = time.perf_counter()
            page.goto("/ops/cluster/")
            page.locator("#heatmap[data-synced=true]").wait_for(timeout=60_000)
            loaded = (time.perf_counter() - start) * 1000
            result: dict[str, Any] = page.evaluate(APPLY_UPDATE_JS, runs)
            results.append({**result, "loaded_ms": loaded, "height": height})
            height = int(page.evaluate("document.documentElement.scrollHeight"))
            context.close()
        chromium.close()
    return results


def _p50(values: list[float]) -> str:
    return f"p50 {statistics.median(values):7.1f} ms, max {max(values):7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--held", type=float, default=0.8, help="share of the GPUs held by running workloads")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    started = time.perf_counter()
    _setup(args.nodes, args.gpus, args.held)
    from django.conf import settings
    from django.db import connection

    print(f"fleet: {args.nodes} simulated nodes x {args.gpus} GPUs, {args.held:.0%} held, on {connection.vendor}")
    print(f"  set up in {time.perf_counter() - started:.1f} s")
    times, body, client = _render(args.runs)
    cells = body.count(b"data-gpu=")
    print(f"server render /ops/cluster/ (Django handler): {_p50(times)} over {args.runs} runs; {cells} cells")
    print(f"response: {len(body):,} bytes, {len(gzip.compress(body)):,} gzip-compressed")
    session = (settings.SESSION_COOKIE_NAME, client.cookies[settings.SESSION_COOKIE_NAME].value)
    with _served() as url:
        fetched = _fetch(url, f"{session[0]}={session[1]}", args.runs)
        print(f"HTTP GET through uvicorn (ASGI):              {_p50(fetched)}")
        windows = _browser(url, session, args.runs)
    for window in windows:
        script = [applied for applied, _ in window["timings"]]
        painted = [frame for _, frame in window["timings"]]
        print(f"browser, window 1600 x {window['height']} px (page live in {window['loaded_ms']:.0f} ms):")
        print(f"  one update of all {window['cells']} cells, parse + apply: {_p50(script)}")
        print(f"  ... until the next frame is painted:          {_p50(painted)}")
    print(json.dumps({"render_ms": times, "bytes": len(body), "browser": windows}))


if __name__ == "__main__":
    main()
