"""A full scheduling pass through the shell on Postgres: snapshot, core and commit, for the Alibaba 2023 cluster.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud_bench \
        .venv/bin/python bench/scheduler_shell.py [--repeat 3]

It migrates the scratch database in DATABASE_URL, then for each run empties
the workload tables and loads all 1,213 GPU nodes (6,212 GPUs) of
openb_node_list_gpu_node.csv into one pool and all 8,152 pods of
openb_pod_list_default.csv as pending workloads of 10 tenants (pods hashed
to tenants by CRC-32 of their name; guarantees proportional to GPU-hours, the
whole pool as limit, one project per tenant; a fractional GPU counts as one).
It then times `run_pass()` (snapshot, core, commit of every placement and
every waiting reason, in one transaction) and reports each phase.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
TRACE = ROOT.parent / "shared" / "data" / "traces" / "alibaba-gpu-v2023"
POOL = "openb"


def _reset() -> None:
    """Empty what a run creates, keeping the schema."""
    from django.contrib.auth.models import User

    from inventory.models import Gpu, Node, NodePool
    from jobs.models import Allocation, Workload, WorkloadEvent
    from tenants.models import Project, ProjectQuota, Tenant, TenantQuota

    for model in (WorkloadEvent, Allocation, Workload, ProjectQuota, TenantQuota, Project):
        model.all_tenants.all().delete()
    Gpu.objects.all().delete()
    Node.objects.all().delete()
    NodePool.objects.filter(name=POOL).delete()
    Tenant.objects.filter(slug__startswith="tenant-").delete()
    User.objects.filter(username="bench").delete()


def _load() -> int:
    """Load the cluster, tenants and pending pods; return the number of workloads."""
    from django.contrib.auth.models import User
    from django.utils import timezone

    from inventory.models import Gpu, Node, NodePool
    from jobs.models import Workload
    from jobs.scheduler.simulator import build, traces
    from tenants.models import Project, ProjectQuota, Tenant, TenantQuota

    pool = NodePool.objects.create(name=POOL)
    trace_nodes = traces.alibaba_nodes(TRACE)
    nodes = Node.objects.bulk_create(
        Node(
            name=n.name,
            pool=pool,
            runtime="simulated",
            state="ready",
            cpu_cores=n.cpu_milli // 1000,
            memory_mib=n.memory_mib,
        )
        for n in trace_nodes
    )
    Gpu.objects.bulk_create(
        Gpu(node=node, index=i, uuid=f"GPU-{node.name}-{i}", model=n.model)
        for node, n in zip(nodes, trace_nodes, strict=True)
        for i in range(n.gpus)
    )
    pods = traces.alibaba_pods(TRACE / "openb_pod_list_default.csv")
    capacity = sum(n.gpus for n in trace_nodes)
    tenant_quotas, _ = build.default_quotas(build.gpu_hour_shares(pods), capacity)
    owner = User.objects.create_user("bench")
    tenants = {q.tenant: Tenant.objects.create(slug=q.tenant, name=q.tenant) for q in tenant_quotas}
    projects = {slug: Project.all_tenants.create(tenant=t, slug=slug, name=slug) for slug, t in tenants.items()}
    for q in tenant_quotas:
        weight = min(1000, int(q.weight))
        TenantQuota.all_tenants.create(
            tenant=tenants[q.tenant], pool=pool, guaranteed=q.guaranteed, limit=q.limit, weight=weight
        )
        ProjectQuota.all_tenants.create(
            tenant=tenants[q.tenant], project=projects[q.tenant], pool=pool, guaranteed=q.guaranteed, limit=q.limit
        )
    start = timezone.now()
    Workload.all_tenants.bulk_create(
        (
            Workload(
                tenant=tenants[pod.tenant],
                project=projects[pod.tenant],
                owner=owner,
                name=pod.id,
                image="registry.example.com/bench:1",
                gpus_per_replica=pod.gpus,
                gpu_models=sorted(pod.models),
                pool=pool,
                cpu_milli=pod.cpu_milli,
                memory_mib=pod.memory_mib,
                submitted_at=start + timedelta(milliseconds=i),
            )
            for i, pod in enumerate(pods)
        ),
        batch_size=2000,
    )
    return len(pods)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from jobs.scheduler.shell import run_pass

    if connection.vendor != "postgresql":
        raise SystemExit("Set DATABASE_URL to a scratch Postgres database: this measures the shell on Postgres.")
    call_command("migrate", interactive=False, verbosity=0)
    runs = []
    for _ in range(args.repeat):
        _reset()
        workloads = _load()
        started = time.perf_counter()
        result = run_pass()
        total = time.perf_counter() - started
        assert result is not None
        runs.append({"total_s": round(total, 3), **{k: round(v, 3) for k, v in result.timings.items()}})
        runs[-1].update(placed=result.placed, waiting=result.waiting)
    _reset()
    totals = sorted(run["total_s"] for run in runs)
    print(
        json.dumps(
            {
                "workloads": workloads,
                "pool": POOL,
                "tenants": "pods hashed to 10 tenants by CRC-32 of their name",
                "median_total_s": statistics.median(totals),
                "max_total_s": totals[-1],
                "runs": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
