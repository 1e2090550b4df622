"""The hand-written SQL of the fast paths `jobs_sql` and `telemetry_sql`: each function timed with its switch on, off.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud_bench \
        .venv/bin/python bench/fast_sql.py [--runs 50]

It migrates the scratch database in DATABASE_URL and fills it as the
figures in jobs/fast_sql.py's and inventory/fast_sql.py's docstrings were
taken: 1,000 GPUs on 125 nodes in 4 pools, 4 tenants of 8 projects with a
quota in every pool, 5,000 workloads, a submission batch's worth of keys
(32). Then each function runs `--runs` times with the switch on and as
many off, interleaved in rounds, writes in a savepoint rolled back after
each call; it reports the median milliseconds each way and their ratio
(off / on: what the hand-written statement saves). docs/fastpaths.md
keeps the figures and says which statements the ratios kept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")

PREFIX = "fastsql-"
KEYS = 32
ROUNDS = 5


def _reset() -> None:
    """Empty what a run creates, keeping the schema."""
    from django.contrib.auth.models import User

    from inventory.models import Gpu, GpuMinute, Node, NodePool
    from jobs.models import AllowedImage, Workload, WorkloadEvent
    from tenants.models import Project, ProjectQuota, Tenant, TenantQuota

    tenants = Tenant.objects.filter(slug__startswith=PREFIX)
    for model in (WorkloadEvent, Workload, ProjectQuota, TenantQuota, Project):
        model.all_tenants.filter(tenant__in=tenants).delete()
    AllowedImage.objects.filter(tenant__in=tenants).delete()
    pools = NodePool.objects.filter(name__startswith=PREFIX)
    GpuMinute.objects.filter(gpu__node__pool__in=pools).delete()
    Gpu.objects.filter(node__pool__in=pools).delete()
    Node.objects.filter(pool__in=pools).delete()
    pools.delete()
    tenants.delete()
    User.objects.filter(username__startswith=PREFIX).delete()


def _load() -> dict[str, Any]:
    """Fill the fleet, tenants, quotas and workloads; return what the timed calls are asked about."""
    from django.contrib.auth.models import User

    from inventory.models import Gpu, Node, NodePool
    from jobs.choices import WorkloadKind, WorkloadState
    from jobs.models import AllowedImage, Workload
    from tenants.models import Project, ProjectQuota, Tenant, TenantQuota

    pools = [NodePool.objects.create(name=f"{PREFIX}{i}") for i in range(4)]
    nodes = Node.objects.bulk_create(
        Node(name=f"{PREFIX}n{i}", pool=pools[i % 4], runtime="simulated", state="ready") for i in range(125)
    )
    gpus = Gpu.objects.bulk_create(
        Gpu(node=node, index=i, uuid=f"{PREFIX}{node.name}-{i}", model="H100") for node in nodes for i in range(8)
    )
    tenants = [Tenant.objects.create(slug=f"{PREFIX}{i}", name=f"T{i}") for i in range(4)]
    owner = User.objects.create(username=f"{PREFIX}owner")
    projects = [
        Project.all_tenants.create(tenant=tenant, slug=f"p{i}", name=f"P{i}") for tenant in tenants for i in range(8)
    ]
    for tenant in tenants:
        AllowedImage.objects.bulk_create(AllowedImage(tenant=tenant, pattern=f"registry/{i}/*") for i in range(5))
        TenantQuota.all_tenants.bulk_create(
            TenantQuota(tenant=tenant, pool=pool, limit=200, max_pending_workloads=1000) for pool in pools
        )
    ProjectQuota.all_tenants.bulk_create(
        ProjectQuota(tenant_id=project.tenant_id, project=project, pool=pool, limit=50, max_notebooks_per_user=4)
        for project in projects
        for pool in pools
    )
    states = [WorkloadState.PENDING, WorkloadState.RUNNING, WorkloadState.SUCCEEDED, WorkloadState.FAILED]
    workloads = Workload.all_tenants.bulk_create(
        (
            Workload(
                tenant_id=projects[i % 32].tenant_id,
                project=projects[i % 32],
                owner=owner,
                pool=pools[i % 4],
                kind=WorkloadKind.NOTEBOOK if i % 5 == 0 else WorkloadKind.JOB,
                state=states[i % 4],
                name=f"w{i}",
                image="registry/0/x",
            )
            for i in range(5000)
        ),
        batch_size=1000,
    )
    return {
        "tenants": [tenant.pk for tenant in tenants[:3]],
        "pairs": sorted((project.pk, pools[i % 4].pk) for i, project in enumerate(projects[:KEYS])),
        "triples": sorted({(project.pk, owner.pk, pools[i % 4].pk) for i, project in enumerate(projects[:KEYS])}),
        "pools": [pool.pk for pool in pools],
        "pending": [w.pk for w in workloads if w.state == WorkloadState.PENDING][:KEYS],
        "gpus": [gpu.pk for gpu in gpus],
        "nodes": [node.pk for node in nodes],
    }


def _calls(asked: dict[str, Any]) -> dict[str, tuple[str, Callable[[], object]]]:
    """Return each timed call, and its fast path's switch, by name; writes are rolled back after (`_timed`)."""
    from common.fastpaths import JOBS_SQL, TELEMETRY_SQL
    from inventory import fast_sql as telemetry
    from inventory.choices import GpuHealth, NodeState
    from jobs import fast_sql
    from jobs.choices import WorkloadState

    now = datetime.now(UTC)
    minute = int(now.timestamp()) // 60 * 60
    pending = WorkloadState.PENDING.value
    gone = [NodeState.RETIRED.value, NodeState.FAILED.value]
    sample = {"utilization": 50.0, "memory_used_mib": 1000, "power_w": 300.0}
    return {
        "allowed_image_rows (3 tenants)": (JOBS_SQL, lambda: fast_sql.allowed_image_rows(asked["tenants"])),
        "quota_limits (32 pairs, locked)": (JOBS_SQL, lambda: fast_sql.quota_limits(asked["pairs"], lock=True)),
        "gpu_counts (4 pools)": (
            JOBS_SQL,
            lambda: fast_sql.gpu_counts(asked["pools"], failed=GpuHealth.FAILED.value, gone_node_states=gone),
        ),
        "insert_submitted_events (32)": (
            JOBS_SQL,
            lambda: fast_sql.insert_submitted_events(
                asked["pending"], kind="workload.submitted", to_state=pending, created_at=now
            ),
        ),
        "record_reasons (32)": (
            JOBS_SQL,
            lambda: fast_sql.record_reasons(
                [("QUOTA", "Waiting for quota.", "", i, w) for i, w in enumerate(asked["pending"])], pending=pending
            ),
        ),
        "record_plans (32)": (
            JOBS_SQL,
            lambda: fast_sql.record_plans(
                [(now, "history", None, [{"node": "n", "gpus": ["g"]}], w) for w in asked["pending"]], pending=pending
            ),
        ),
        "store_gpu_samples (1,000 GPUs)": (
            TELEMETRY_SQL,
            lambda: telemetry.store_gpu_samples({gpu: (50.0, 1000, sample) for gpu in asked["gpus"]}, now),
        ),
        "merge_gpu_minutes (1,000 minutes)": (
            TELEMETRY_SQL,
            lambda: telemetry.merge_gpu_minutes(
                [(gpu, minute, 60, 3000.0, 80.0, 2000, 60, 18000.0, 70.0) for gpu in asked["gpus"]]
            ),
        ),
        "advance_rollup_marks (125 nodes)": (
            TELEMETRY_SQL,
            lambda: telemetry.advance_rollup_marks({node: now.timestamp() for node in asked["nodes"]}),
        ),
    }


def _timed(call: Callable[[], object], switch: str, on: bool, runs: int) -> list[float]:
    """Return the milliseconds of `runs` calls with the fast path `switch` on or off, each rolled back after."""
    from django.conf import settings
    from django.db import transaction
    from django.test import override_settings

    took = []
    with override_settings(FAST_PATHS={**settings.FAST_PATHS, switch: on}), transaction.atomic():
        for _ in range(runs):
            sid = transaction.savepoint()
            started = time.perf_counter()
            call()
            took.append((time.perf_counter() - started) * 1000)
            transaction.savepoint_rollback(sid)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50, help="calls each way per function (default 50)")
    args = parser.parse_args()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        raise SystemExit("Set DATABASE_URL to a scratch Postgres database: the figures are Postgres's.")
    call_command("migrate", interactive=False, verbosity=0)
    _reset()
    try:
        asked = _load()
        results = {}
        for name, (switch, call) in _calls(asked).items():
            on: list[float] = []
            off: list[float] = []
            # Interleaved rounds, so a busy machine's noise falls on both ways alike.
            for _ in range(ROUNDS):
                on += _timed(call, switch, True, max(1, args.runs // ROUNDS))
                off += _timed(call, switch, False, max(1, args.runs // ROUNDS))
            fast, framework = statistics.median(on), statistics.median(off)
            results[name] = {
                "switch": switch,
                "on_ms": round(fast, 3),
                "off_ms": round(framework, 3),
                "off_over_on": round(framework / fast, 2),
            }
            print(name, results[name], file=sys.stderr, flush=True)
    finally:
        _reset()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
