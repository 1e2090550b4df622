"""Latency of listing a tenant's projects over HTTP, with 1,000 projects on Postgres.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud_bench \
        .venv/bin/python bench/list_projects.py [--requests 500] [--projects 1000]

It migrates the database named in DATABASE_URL (use a scratch one: it is
filled with a bench tenant), starts `gpucloud serve` (uvicorn, one process)
against it, lists the projects with an API token over one keep-alive
connection, and prints p50/p99 latency for the default page (50) and a
500-item page, plus the query count of each request.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")


def _setup(projects: int) -> str:
    """Migrate, create the bench tenant with `projects` projects and an admin token; return the token secret."""
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection

    from tenants.context import Actor
    from tenants.models import Membership, Project, Tenant
    from tenants.services import create_token

    if connection.vendor != "postgresql":
        raise SystemExit("Set DATABASE_URL to a Postgres database: this benchmark measures Postgres.")
    call_command("migrate", verbosity=0)
    tenant, _ = Tenant.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    user, _ = User.objects.get_or_create(username="bench-admin")
    Membership.all_tenants.get_or_create(tenant=tenant, user=user, defaults={"role": "admin"})
    have = Project.all_tenants.filter(tenant=tenant).count()
    Project.all_tenants.bulk_create(
        Project(tenant=tenant, slug=f"project-{i:05d}", name=f"Project {i}") for i in range(have, projects)
    )
    return create_token(actor=Actor(user=user), tenant=tenant, name="bench", role="admin", expires_in_days=1).secret


def _query_count(path: str, secret: str) -> int:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_HOST="127.0.0.1")
    client.get(path)  # warm: the token's last_used_at write happens once a minute at most
    with CaptureQueriesContext(connection) as queries:
        assert client.get(path).status_code == 200
    return len(queries)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", "from gpucloud.cli import main; main()", "serve", "--port", str(port)]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _listening(server, port, "gpucloud serve")


def _listening(server: subprocess.Popen[bytes], port: int, what: str) -> subprocess.Popen[bytes]:
    """Return `server` once it accepts connections on `port` (at most 60 s); kill it and stop the bench if not."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit(f"{what} did not start")


def _measure(port: int, path: str, secret: str, requests: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Authorization": f"Bearer {secret}", "Host": "127.0.0.1"}
    timings = []
    for i in range(requests + 20):
        started = time.perf_counter()
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body = response.read()
        elapsed = (time.perf_counter() - started) * 1000
        if response.status != 200:
            raise SystemExit(f"{path} answered {response.status}: {body[:200]!r}")
        if i >= 20:  # the first requests warm connections and caches
            timings.append(elapsed)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--projects", type=int, default=1000)
    args = parser.parse_args()
    secret = _setup(args.projects)
    port = _free_port()
    server = _serve(port)
    results = {}
    try:
        for label, path in (
            ("page of 50", "/api/v1/tenants/bench/projects/"),
            ("page of 500", "/api/v1/tenants/bench/projects/?page_size=500"),
        ):
            timings = sorted(_measure(port, path, secret, args.requests))
            results[label] = {
                "p50_ms": round(statistics.median(timings), 2),
                "p99_ms": round(timings[int(len(timings) * 0.99) - 1], 2),
                "queries": _query_count(path, secret),
                "requests": len(timings),
            }
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=20)
    print(json.dumps({"projects": args.projects, "results": results}, indent=2))


if __name__ == "__main__":
    main()
