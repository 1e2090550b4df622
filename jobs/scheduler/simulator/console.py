"""The console's own recorded workloads as a trace (`gpucloud simulate --from-console [--since DAYS]`).

What is read, and what it becomes:
- every node pool (placement policy, dedicated tenant) and every node in
  service (not registered, provisioning, failed or retired) with its present
  GPUs; a node's model is its GPUs' most common one; a node that reports no
  CPU or memory (0) is taken to have plenty, so only GPUs limit it;
- every workload that ran to an end: started and finished, in a final
  state (succeeded, failed, cancelled, lost) or a hibernated notebook,
  submitted within the last `since_days` days when given. Its run time is
  the `run_seconds` the product recorded when it ended (its last attempt
  plus what checkpoints kept from earlier ones), else finished_at -
  started_at of its last attempt; notebooks replay as jobs of that run
  time. Tenant, project, pool, GPUs per replica, replicas, accepted GPU
  models, CPU, memory and image are its own; its time limit is its
  `max_runtime_seconds` (submission fills it with the quota's maximum when
  the job named none), else the simulation draws one. Times are seconds
  since the first submission;
- the tenants' and projects' real quotas, per pool.

Django is imported only here, and only when this is called: the simulator
itself runs without Django configured.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from jobs.scheduler.core import PlacementPolicy, Pool, ProjectQuota, TenantQuota
from jobs.scheduler.simulator.traces import Trace, TraceJob, TraceNode

# A node that reports no CPU or memory: what it is taken to have (only its GPUs limit it).
_PLENTY_CPU_MILLI = 1 << 30
_PLENTY_MEMORY_MIB = 1 << 40
_NOT_IN_SERVICE = ("registered", "provisioning", "failed", "retired")


def _setup_django() -> None:
    """Configure Django with the console's settings unless the process already did (the tests, manage.py)."""
    import django
    from django.apps import apps

    if not apps.ready:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
        django.setup()


def console_trace(
    since_days: float | None = None, now: datetime | None = None
) -> tuple[Trace, tuple[TenantQuota, ...], tuple[ProjectQuota, ...]]:
    """Return the console's finished workloads as a trace on its pools and nodes, with its real quotas.

    Raises ValueError when there is nothing to replay (no finished workload, or no node with a GPU).
    """
    _setup_django()
    from django.utils import timezone

    moment = now or timezone.now()
    since = moment - timedelta(days=since_days) if since_days is not None else None
    nodes = _nodes()
    jobs = _jobs(since)
    if not jobs:
        raise ValueError("the console has no finished workload to replay" + (" in that window" if since else ""))
    if not any(node.gpus for node in nodes):
        raise ValueError("the console has no node in service with a GPU")
    trace = Trace("console", nodes, jobs, _pools())
    return trace, _tenant_quotas(), _project_quotas()


def _pools() -> tuple[Pool, ...]:
    from inventory.models import NodePool

    rows = NodePool.objects.order_by("name").values("name", "placement_policy", "dedicated_tenant__slug")
    return tuple(
        Pool(r["name"], PlacementPolicy(r["placement_policy"]), dedicated_tenant=r["dedicated_tenant__slug"])
        for r in rows
    )


def _nodes() -> tuple[TraceNode, ...]:
    from inventory.models import Gpu, Node

    rows = list(
        Node.objects.exclude(state__in=_NOT_IN_SERVICE)
        .order_by("name")
        .values("id", "name", "pool__name", "cpu_cores", "memory_mib")
    )
    models: dict[int, Counter[str]] = defaultdict(Counter)
    for gpu in Gpu.objects.filter(node_id__in=[r["id"] for r in rows], present=True).values("node_id", "model"):
        models[gpu["node_id"]][gpu["model"]] += 1
    return tuple(_node(row, models[row["id"]]) for row in rows)


def _node(row: Mapping[str, Any], models: Counter[str]) -> TraceNode:
    model = models.most_common(1)[0][0] if models else ""
    return TraceNode(
        name=row["name"],
        gpus=sum(models.values()),
        model=model,
        cpu_milli=row["cpu_cores"] * 1000 or _PLENTY_CPU_MILLI,
        memory_mib=row["memory_mib"] or _PLENTY_MEMORY_MIB,
        pool=row["pool__name"],
    )


def _jobs(since: datetime | None) -> tuple[TraceJob, ...]:
    from jobs.choices import TERMINAL_STATES, WorkloadState
    from jobs.models import Workload

    ended = [*TERMINAL_STATES, WorkloadState.HIBERNATED]
    query = Workload.all_tenants.filter(state__in=ended, started_at__isnull=False, finished_at__isnull=False)
    if since is not None:
        query = query.filter(submitted_at__gte=since)
    rows = list(
        query.order_by("submitted_at", "id").values(
            "id",
            "tenant__slug",
            "project__slug",
            "pool__name",
            "image",
            "gpus_per_replica",
            "replicas",
            "gpu_models",
            "cpu_milli",
            "memory_mib",
            "submitted_at",
            "started_at",
            "finished_at",
            "run_seconds",
            "max_runtime_seconds",
        )
    )
    if not rows:
        return ()
    origin = rows[0]["submitted_at"]
    return tuple(_job(row, origin) for row in rows if _ran(row))


def _ran(row: Mapping[str, Any]) -> bool:
    started, finished = row["started_at"], row["finished_at"]
    return started is not None and finished is not None and finished > started


def _run_s(row: Mapping[str, Any]) -> float:
    recorded = row["run_seconds"]
    return float(recorded) if recorded else (row["finished_at"] - row["started_at"]).total_seconds()


def _job(row: Mapping[str, Any], origin: datetime) -> TraceJob:
    limit = row["max_runtime_seconds"]
    return TraceJob(
        id=str(row["id"]),
        tenant=row["tenant__slug"],
        submitted_at=(row["submitted_at"] - origin).total_seconds(),
        duration_s=_run_s(row),
        gpus=row["gpus_per_replica"],
        replicas=row["replicas"],
        cpu_milli=row["cpu_milli"],
        memory_mib=row["memory_mib"],
        models=frozenset(row["gpu_models"] or ()),
        image=row["image"],
        project=row["project__slug"],
        pool=row["pool__name"],
        limit_s=float(limit) if limit is not None else None,
    )


def _tenant_quotas() -> tuple[TenantQuota, ...]:
    from tenants.models import TenantQuota as Quota

    rows = Quota.all_tenants.order_by("tenant__slug", "pool__name").values(
        "tenant__slug", "pool__name", "guaranteed", "limit", "weight"
    )
    return tuple(
        TenantQuota(r["tenant__slug"], r["pool__name"], r["guaranteed"], r["limit"], float(r["weight"])) for r in rows
    )


def _project_quotas() -> tuple[ProjectQuota, ...]:
    from tenants.models import ProjectQuota as Quota

    rows = Quota.all_tenants.order_by("project__slug", "pool__name").values(
        "project__slug", "tenant__slug", "pool__name", "guaranteed", "limit", "weight"
    )
    return tuple(
        ProjectQuota(
            r["project__slug"], r["tenant__slug"], r["pool__name"], r["guaranteed"], r["limit"], float(r["weight"])
        )
        for r in rows
    )
