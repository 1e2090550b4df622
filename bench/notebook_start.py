"""Notebook submit to a usable JupyterLab through the console's proxy, with the process runtime.

    .venv/bin/python bench/notebook_start.py [--runs 5]

Embedded mode in a scratch directory: the controller's worker and the
node's agent (process runtime) run in this process, and the console's ASGI
application is served by uvicorn on a loopback port. Each run submits a
notebook through the submission service as its owner would and measures
until (a) the ledger says `running` (Jupyter answered the agent's readiness
check) and (b) the owner's browser session gets 200 for the JupyterLab page
and for the server's status through `/notebooks/<id>/`. Prints JSON with
the median and worst of both.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from execution_start import _setup_django

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NODE = "bench-local"


def _world() -> tuple[object, object, object]:
    from django.contrib.auth.models import User

    from inventory.models import Gpu, Node, NodePool
    from tenants.models import Membership, Project, ProjectQuota, Tenant, TenantQuota

    pool, _ = NodePool.objects.get_or_create(name="bench")
    tenant, _ = Tenant.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    user = User.objects.create_user("bench-owner", password=None)
    Membership.all_tenants.create(tenant=tenant, user=user, role="admin")
    project = Project.all_tenants.create(tenant=tenant, slug="bench", name="Bench")
    TenantQuota.all_tenants.create(tenant=tenant, pool=pool, guaranteed=8, limit=8)
    ProjectQuota.all_tenants.create(tenant=tenant, project=project, pool=pool, guaranteed=8, limit=8)
    node = Node.objects.create(name=NODE, pool=pool, runtime="process", state="ready", cpu_cores=8, memory_mib=16000)
    Gpu.objects.create(node=node, index=0, uuid=f"GPU-{NODE}-0", model="bench")  # handed to the process only by name
    return user, project, pool


def _start(work_dir: Path, *, pages: bool = False) -> str:
    """Start the worker and agent (process runtime) and the console under uvicorn; return the console's URL.

    `pages`: the console's pages work in a browser too, their static files served from the finders
    (no collectstatic, no manifest), as in development.
    """
    import uvicorn
    from django.conf import settings
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    from common.origins import parse_origin_pattern
    from gpucloud import embedded
    from gpucloud.asgi import application
    from gpucloud.celery import app
    from inventory.agent import executor
    from inventory.agent.config import AgentConfig, activate
    from inventory.models import agent_queue_for

    config = AgentConfig(node=NODE, work_dir=work_dir, process_enabled=True, probe="simulated")
    activate(config)
    executor._executor = executor.Executor(config)
    embedded.start_workers(app, agent_queue=agent_queue_for(NODE))
    served: Any = application
    if pages:
        settings.STORAGES = {
            **settings.STORAGES,
            "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
        }
        served = ASGIStaticFilesHandler(application)  # type: ignore[arg-type]
    # As `gpucloud up` serves: the console on one port, the notebooks' own origin on a second.
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    console, notebooks = (f"http://127.0.0.1:{sock.getsockname()[1]}" for sock in sockets)
    settings.NOTEBOOK_ORIGIN = parse_origin_pattern(notebooks)
    server = uvicorn.Server(uvicorn.Config(served, log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return console


def hand_off(console: str, cookie: str, workload_id: int) -> tuple[str, str] | None:
    """Enter notebook `workload_id` as a browser does: the console's hand-off with the session `cookie`, then the
    notebook origin's entry. Return (the notebook origin, its cookie as a Cookie header), or None while the
    console has no notebook to hand over (not running yet)."""
    import httpx

    handed = httpx.get(f"{console}/notebooks/{workload_id}/open", headers={"Cookie": cookie}, timeout=10)
    if handed.status_code != 302:
        return None
    entry = urlsplit(handed.headers["location"])
    entered = httpx.get(handed.headers["location"], timeout=10)
    name = next(iter(entered.cookies.keys()))
    return f"{entry.scheme}://{entry.netloc}", f"{name}={entered.cookies[name]}"


def _session(user: object) -> str:
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)  # type: ignore[arg-type]
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def _run(console: str, cookie: str, user: object, project: object, pool: object) -> tuple[float, float]:
    import httpx

    from jobs import services
    from jobs.models import Workload
    from tenants.context import Actor

    actor = Actor(user=user)  # type: ignore[arg-type]
    data = {
        "name": "nb",
        "kind": "notebook",
        "image": "registry.local/jupyter:lab",
        "pool": pool,
        "gpus_per_replica": 1,
    }
    started = time.perf_counter()
    workload = services.submit_workload(actor=actor, project=project, data=data)  # type: ignore[arg-type]
    running = 0.0
    entered = None
    with httpx.Client(timeout=10) as browser:
        while True:
            if time.perf_counter() - started > 60:
                raise RuntimeError("the notebook was not usable within 60 s")
            if not running and Workload.all_tenants.filter(pk=workload.pk, state="running").exists():
                running = time.perf_counter() - started
            if running and entered is None:
                entered = hand_off(console, cookie, workload.pk)
                if entered is not None:
                    browser.base_url, browser.headers["Cookie"] = httpx.URL(entered[0]), entered[1]
            if entered is not None:
                lab = browser.get(f"/notebooks/{workload.pk}/lab")
                status = browser.get(f"/notebooks/{workload.pk}/api/status")
                if lab.status_code == 200 and status.status_code == 200:
                    usable = time.perf_counter() - started
                    break
            time.sleep(0.01)
    services.cancel_workload(actor=actor, workload=Workload.all_tenants.get(pk=workload.pk))
    while Workload.all_tenants.filter(pk=workload.pk, allocations__released_at__isnull=True).exists():
        time.sleep(0.05)
    time.sleep(0.6)  # past the pass trigger's debounce window
    return running, usable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("NOTEBOOK_COMMAND", f"{sys.executable},-m,jupyterlab")
    with tempfile.TemporaryDirectory(prefix="gpucloud-bench-") as scratch:
        _setup_django(Path(scratch))
        user, project, pool = _world()
        console = _start(Path(scratch) / "agent")
        cookie = _session(user)
        runs = [_run(console, cookie, user, project, pool) for _ in range(args.runs)]
    running = [r for r, _ in runs]
    usable = [u for _, u in runs]
    print(
        json.dumps(
            {
                "runs": args.runs,
                "submit_to_running_s": {"median": round(statistics.median(running), 2), "max": round(max(running), 2)},
                "submit_to_usable_through_proxy_s": {
                    "median": round(statistics.median(usable), 2),
                    "max": round(max(usable), 2),
                },
            },
            indent=2,
        )
    )
    os._exit(0)  # the embedded worker and uvicorn threads do not need an orderly stop


if __name__ == "__main__":
    main()
