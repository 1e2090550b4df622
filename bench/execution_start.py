"""Submit to running on an idle node with the Docker runtime, against `docker run` of the same image.

    .venv/bin/python bench/execution_start.py [--runs 20]

Embedded mode (a scratch SQLite database in a temporary directory, the
in-process transport; set DATABASE_URL/REDIS_URL to measure a distributed
setup instead): the controller's worker and the node's agent run in this
process, as `gpucloud up` runs them. Each run submits a one-container job
through the submission service, which asks for a scheduling pass on commit
(debounced), and waits until the ledger says `running` (the pass placed it,
the launch task sent it to the agent, the agent created and started the
container, and its start report was applied). The baseline is `docker run
-d` of the same image and command, which returns once the container runs.
Prints JSON with p50/p95 of both and the difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
IMAGE = "gpucloud-test/busybox:latest"
COMMAND = ["sh", "-c", "sleep 60"]
NODE = "bench-docker"


def _setup_django(data_dir: Path) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
    os.environ.setdefault("GPUCLOUD_DATA_DIR", str(data_dir))
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def _world() -> tuple[object, object, object]:
    from django.contrib.auth.models import User

    from inventory.models import Gpu, Node, NodePool
    from tenants.models import Membership, Project, ProjectQuota, Tenant, TenantQuota

    pool, _ = NodePool.objects.get_or_create(name="bench")
    tenant, _ = Tenant.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    user = User.objects.filter(username="bench").first() or User.objects.create_user("bench", password=None)
    Membership.all_tenants.get_or_create(tenant=tenant, user=user, defaults={"role": "admin"})
    project, _ = Project.all_tenants.get_or_create(tenant=tenant, slug="bench", defaults={"name": "Bench"})
    TenantQuota.all_tenants.get_or_create(tenant=tenant, pool=pool, defaults={"guaranteed": 8, "limit": 8})
    ProjectQuota.all_tenants.get_or_create(
        tenant=tenant, project=project, pool=pool, defaults={"guaranteed": 8, "limit": 8}
    )
    node, created = Node.objects.get_or_create(
        name=NODE, defaults={"pool": pool, "runtime": "docker", "state": "ready", "cpu_cores": 8, "memory_mib": 16000}
    )
    if created:
        Gpu.objects.create(node=node, index=0, uuid=f"GPU-{NODE}-0", model="bench")
    return user, project, pool


def _start_workers(work_dir: Path) -> None:
    from gpucloud import embedded
    from gpucloud.celery import app
    from inventory.agent import executor
    from inventory.agent.config import AgentConfig, activate
    from inventory.models import agent_queue_for

    config = AgentConfig(node=NODE, work_dir=work_dir, pull_images=False, probe="simulated")
    activate(config)
    executor._executor = executor.Executor(config)
    embedded.start_workers(app, agent_queue=agent_queue_for(NODE))


def _gpucloud_run(user: object, project: object, pool: object) -> float:
    from jobs import services
    from jobs.models import Workload
    from tenants.context import Actor

    data = {
        "name": "bench",
        "image": IMAGE,
        "pool": pool,
        "command": COMMAND,
        "gpus_per_replica": 0,
        "cpu_milli": 100,
        "memory_mib": 32,
    }
    actor = Actor(user=user)  # type: ignore[arg-type]
    started = time.perf_counter()
    workload = services.submit_workload(actor=actor, project=project, data=data)  # type: ignore[arg-type]
    while Workload.all_tenants.filter(pk=workload.pk).values_list("state", flat=True).first() != "running":
        if time.perf_counter() - started > 60:
            raise RuntimeError("the workload did not start within 60 s")
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    services.cancel_workload(actor=actor, workload=Workload.all_tenants.get(pk=workload.pk))
    while Workload.all_tenants.filter(pk=workload.pk, allocations__released_at__isnull=True).exists():
        time.sleep(0.05)  # the GPU is free again before the next run
    time.sleep(0.6)  # past the pass trigger's debounce window
    return elapsed


def _docker_run() -> float:
    started = time.perf_counter()
    out = subprocess.run(["docker", "run", "-d", "--rm", IMAGE, *COMMAND], check=True, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    subprocess.run(["docker", "rm", "-f", out.stdout.strip()], check=True, capture_output=True)
    return elapsed


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p95_ms": round(ordered[max(0, round(0.95 * len(ordered)) - 1)] * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    subprocess.run([str(ROOT / ".ci" / "build-test-image"), IMAGE], check=True, capture_output=True)
    with tempfile.TemporaryDirectory(prefix="gpucloud-bench-") as scratch:
        _setup_django(Path(scratch))
        user, project, pool = _world()
        _start_workers(Path(scratch) / "agent")
        _gpucloud_run(user, project, pool)  # warm-up: the tenant network, imports, connections
        _docker_run()
        ours = [_gpucloud_run(user, project, pool) for _ in range(args.runs)]
        baseline = [_docker_run() for _ in range(args.runs)]
    result = {
        "runs": args.runs,
        "gpucloud_submit_to_running": _summary(ours),
        "docker_run_d": _summary(baseline),
    }
    result["added_p50_ms"] = round(result["gpucloud_submit_to_running"]["p50_ms"] - result["docker_run_d"]["p50_ms"], 1)
    result["added_p95_ms"] = round(result["gpucloud_submit_to_running"]["p95_ms"] - result["docker_run_d"]["p95_ms"], 1)
    print(json.dumps(result, indent=2))
    os._exit(0)  # the embedded worker threads do not need an orderly stop


if __name__ == "__main__":
    main()
