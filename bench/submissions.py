"""Submission API throughput on Postgres: single submissions over HTTP, and bulk submissions.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud_bench \
        .venv/bin/python bench/submissions.py [--single 6000] [--clients 32] [--bulk 1000] [--batches 5] \
        [--bulk-clients 2] [--workers 1] [--floor 0]

It migrates the scratch database in DATABASE_URL, creates a bench tenant
with a project, quotas and a pool with one ready 8-GPU node, starts the web
process (uvicorn serving `gpucloud.asgi:application` as `gpucloud serve`
does, with `--workers` processes and its access log off) against it, and
submits with an API token:

- `--single` single submissions, spread over `--clients` client threads,
  each with its own keep-alive connection: submissions per second over the
  whole run, and p50/p99 latency of every request;
- then `--batches` bulk submissions of `--bulk` workloads each from each of
  `--bulk-clients` clients (workloads per second over the run);
- with `--floor N`, first N authenticated GETs of the tenant itself, spread
  over the same clients: the floor of any API request on this machine
  (authentication, tenant and role lookup, routing, rendering, the ASGI
  server), to compare a submission's cost with.

Every submission runs the full validation (allowed images included) and
writes its event and audit entry; the bench sets no count limit and sends
no Idempotency-Key, so no count query runs and submissions into its one
project need not take turns. Submissions go through the API's ingest
(`jobs/api/fast_ingest.py`), which commits concurrent ones together: the number
of clients sets how many are in flight, so it trades latency for
throughput. The clients run on the same machine as the server and
Postgres and take their share of its cores. Set REDIS_URL (and
SECRET_KEY) to measure with the Redis broker that receives the scheduling
triggers, as in a deployment. The API's throttles are off in the server
it starts (API_THROTTLE=0): one token sending thousands of submissions a
second is what they exist to refuse.
"""

from __future__ import annotations

import argparse
import http.client
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

from list_projects import _free_port, _listening

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
TENANT = "bench-submit"


def _setup() -> str:
    """Migrate, (re)create the bench tenant, its quotas and node; return an admin token's secret."""
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection

    from inventory.models import Gpu, Node, NodePool
    from jobs.models import Workload, WorkloadEvent
    from tenants.context import Actor
    from tenants.models import Membership, Project, ProjectQuota, Tenant, TenantQuota
    from tenants.services import create_token

    if connection.vendor != "postgresql":
        raise SystemExit("Set DATABASE_URL to a scratch Postgres database: this measures Postgres.")
    call_command("migrate", verbosity=0)
    WorkloadEvent.all_tenants.filter(tenant__slug=TENANT).delete()
    Workload.all_tenants.filter(tenant__slug=TENANT).delete()
    tenant, _ = Tenant.objects.get_or_create(slug=TENANT, defaults={"name": "Bench"})
    pool, _ = NodePool.objects.get_or_create(name="bench-submit")
    node, created = Node.objects.get_or_create(
        name="bench-submit-node", defaults={"pool": pool, "runtime": "simulated", "state": "ready", "cpu_cores": 64}
    )
    if created:
        Gpu.objects.bulk_create(Gpu(node=node, index=i, uuid=f"GPU-bench-submit-{i}", model="H100") for i in range(8))
    project, _ = Project.all_tenants.get_or_create(tenant=tenant, slug="alpha", defaults={"name": "Alpha"})
    TenantQuota.all_tenants.get_or_create(tenant=tenant, pool=pool, defaults={"guaranteed": 8, "limit": 8})
    ProjectQuota.all_tenants.get_or_create(
        tenant=tenant, project=project, pool=pool, defaults={"guaranteed": 8, "limit": 8}
    )
    user, _ = User.objects.get_or_create(username="bench-submitter")
    Membership.all_tenants.get_or_create(tenant=tenant, user=user, defaults={"role": "admin"})
    return create_token(actor=Actor(user=user), tenant=tenant, name="bench", role="admin", expires_in_days=1).secret


def _item(i: int) -> dict[str, object]:
    return {"project": "alpha", "pool": "bench-submit", "name": f"job-{i}", "image": "registry.example.com/b:1"}


def _post(conn: http.client.HTTPConnection, path: str, secret: str, body: object | None) -> float:
    """POST `body` (GET when it is None) and return the seconds until the whole answer arrived."""
    headers = {"Authorization": f"Bearer {secret}", "Host": "127.0.0.1", "Content-Type": "application/json"}
    started = time.perf_counter()
    if body is None:
        conn.request("GET", path, headers=headers)
    else:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
    response = conn.getresponse()
    data = response.read()
    if response.status != (200 if body is None else 201):
        raise SystemExit(f"{path} answered {response.status}: {data[:300]!r} (server log: {SERVER_LOG})")
    return time.perf_counter() - started


SERVER_LOG = Path(tempfile.gettempdir()) / "gpucloud-bench-submissions.log"


def _serve(port: int, workers: int) -> subprocess.Popen[bytes]:
    """Start uvicorn with `workers` processes on `port` and return it once it accepts connections.

    Its warnings and errors go to SERVER_LOG, whose path a failed run prints.
    """
    command = [sys.executable, "-m", "uvicorn", "gpucloud.asgi:application", "--port", str(port)]
    command += ["--workers", str(workers), "--lifespan", "off", "--no-access-log", "--log-level", "warning"]
    # One token sends thousands of submissions a second here: the API's throttles would answer most of them
    # 429 (a rate is per token and per user), so the bench measures the submission path with them off.
    env = {**os.environ, "API_THROTTLE": "0"}
    with SERVER_LOG.open("wb") as log:
        server = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    return _listening(server, port, "uvicorn")


def _client(port: int, secret: str, names: range, timings: list[float], floor: bool = False) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    if floor:
        path = f"/api/v1/tenants/{TENANT}/"
        timings.extend(_post(conn, path, secret, None) * 1000 for _ in names)
        return
    path = f"/api/v1/tenants/{TENANT}/workloads/"
    timings.extend(_post(conn, path, secret, _item(i)) * 1000 for i in names)


def _run(threads: list[threading.Thread]) -> float:
    """Start `threads`, wait for them all and return the seconds that took."""
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def _single(port: int, secret: str, count: int, clients: int, floor: bool = False) -> dict[str, float]:
    # Warm every worker process (each has its own connections and caches) before timing.
    _client(port, secret, range(20 * clients), [], floor)
    per_client: list[list[float]] = [[] for _ in range(clients)]
    threads = [
        threading.Thread(target=_client, args=(port, secret, range(c, count, clients), per_client[c], floor))
        for c in range(clients)
    ]
    elapsed = _run(threads)
    timings = sorted(t for each in per_client for t in each)
    if len(timings) != count:
        raise SystemExit(f"only {len(timings)} of {count} submissions answered (server log: {SERVER_LOG})")
    return {
        "requests": count,
        "clients": clients,
        "per_second": round(count / elapsed, 1),
        "p50_ms": round(statistics.median(timings), 2),
        "p99_ms": round(timings[int(len(timings) * 0.99) - 1], 2),
    }


def _bulk_client(port: int, secret: str, size: int, batches: int, offset: int, seconds: list[float]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    path = f"/api/v1/tenants/{TENANT}/workloads/bulk/"
    for batch in range(batches):
        first = offset + batch * size
        items = [{k: v for k, v in _item(i).items() if k != "project"} for i in range(first, first + size)]
        seconds.append(_post(conn, path, secret, {"project": "alpha", "items": items}))


def _bulk(port: int, secret: str, size: int, batches: int, clients: int) -> dict[str, float]:
    """`clients` clients each send `batches` bulk submissions of `size` one after another; workloads per second
    over the whole run (after one warm-up submission per client)."""
    per_client: list[list[float]] = [[] for _ in range(clients)]
    _run([threading.Thread(target=_bulk_client, args=(port, secret, size, 1, c * size, [])) for c in range(clients)])
    offset = clients * size
    threads = [
        threading.Thread(
            target=_bulk_client,
            args=(port, secret, size, batches, offset + c * batches * size, per_client[c]),
        )
        for c in range(clients)
    ]
    elapsed = _run(threads)
    seconds = sorted(t for each in per_client for t in each)
    return {
        "batch_size": size,
        "batches": batches * clients,
        "clients": clients,
        "workloads_per_second": round(size * batches * clients / elapsed, 1),
        "median_batch_s": round(statistics.median(seconds), 3),
        "max_batch_s": round(seconds[-1], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--single", type=int, default=6000)
    parser.add_argument("--bulk", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=5, help="bulk submissions per bulk client")
    parser.add_argument("--bulk-clients", type=int, default=2, help="clients sending bulk submissions at once")
    parser.add_argument("--clients", type=int, default=32, help="client threads sending single submissions")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--floor", type=int, default=0, help="authenticated GETs of the tenant to time first")
    args = parser.parse_args()
    secret = _setup()
    port = _free_port()
    server = _serve(port, args.workers)
    try:
        results: dict[str, object] = {"workers": args.workers}
        if args.floor:
            results["floor_get"] = _single(port, secret, args.floor, args.clients, floor=True)
        results["single"] = _single(port, secret, args.single, args.clients)
        results["bulk"] = _bulk(port, secret, args.bulk, args.batches, args.bulk_clients)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=20)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
