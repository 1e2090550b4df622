"""Submission API throughput on Postgres: single submissions over HTTP, and bulk submissions.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud_bench \
        .venv/bin/python bench/submissions.py [--single 1000] [--bulk 1000] [--batches 5]

It migrates the scratch database in DATABASE_URL, creates a bench tenant
with a project, quotas and a pool with one ready 8-GPU node, starts
`gpucloud serve` (uvicorn, one process) against it, and submits with an
API token over one keep-alive connection: `--single` single submissions
(p50/p99 latency and submissions per second), then `--batches` bulk
submissions of `--bulk` workloads each (workloads per second). Every
submission runs the full validation and writes its event and audit entry.
Set REDIS_URL (and SECRET_KEY) to measure with the Redis broker that
receives the scheduling triggers, as in a deployment.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

from list_projects import _free_port, _serve

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


def _post(conn: http.client.HTTPConnection, path: str, secret: str, body: object) -> float:
    headers = {"Authorization": f"Bearer {secret}", "Host": "127.0.0.1", "Content-Type": "application/json"}
    started = time.perf_counter()
    conn.request("POST", path, body=json.dumps(body), headers=headers)
    response = conn.getresponse()
    data = response.read()
    if response.status != 201:
        raise SystemExit(f"{path} answered {response.status}: {data[:300]!r}")
    return time.perf_counter() - started


def _single(port: int, secret: str, count: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    path = f"/api/v1/tenants/{TENANT}/workloads/"
    for i in range(20):  # warm connections and caches
        _post(conn, path, secret, _item(i))
    started = time.perf_counter()
    timings = sorted(_post(conn, path, secret, _item(i)) * 1000 for i in range(count))
    elapsed = time.perf_counter() - started
    return {
        "submissions": count,
        "per_second": round(count / elapsed, 1),
        "p50_ms": round(statistics.median(timings), 2),
        "p99_ms": round(timings[int(len(timings) * 0.99) - 1], 2),
    }


def _bulk(port: int, secret: str, size: int, batches: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    path = f"/api/v1/tenants/{TENANT}/workloads/bulk/"
    items = [{k: v for k, v in _item(i).items() if k != "project"} for i in range(size)]
    seconds = [_post(conn, path, secret, {"project": "alpha", "items": items}) for _ in range(batches)]
    return {
        "batch_size": size,
        "batches": batches,
        "workloads_per_second": round(size * batches / sum(seconds), 1),
        "median_batch_s": round(statistics.median(seconds), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--single", type=int, default=1000)
    parser.add_argument("--bulk", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    secret = _setup()
    port = _free_port()
    server = _serve(port)
    try:
        results = {"single": _single(port, secret, args.single), "bulk": _bulk(port, secret, args.bulk, args.batches)}
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=20)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
