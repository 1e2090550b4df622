"""Submission rules that read the ledger: quotas, count limits, the pool's GPU models and largest placement.

Each check reads what every item of a submission needs in one set-based
query, whatever the number of items, and raises ValidationError naming the
field and the rule. The caller holds the lock on the project's quota rows,
so the counts cannot change under it.

The reads every submission makes (the locked limits, the pool's GPUs, the
allowed images) are written in SQL through `fetch`: building the same
query with the ORM costs about ten times its round trip to Postgres, which
made query construction the largest part of a single submission
(bench/submissions.py). The SQL is plain enough for SQLite too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Count, Model, Q

from gpucloud.errors import invalid
from inventory.choices import GpuHealth, NodeState
from inventory.models import Gpu, Node, NodePool
from jobs.choices import TERMINAL_STATES, WorkloadKind, WorkloadState
from jobs.models import Workload
from jobs.services.spec import WorkloadSpec, prefixed
from tenants.models import Project, ProjectQuota, TenantQuota

# Nodes whose GPUs count toward the largest placement possible: everything
# that is or may come back in service. Retired and failed nodes do not.
_GONE_NODE_STATES = (NodeState.RETIRED, NodeState.FAILED)
_LIVE_STATES = [s for s in WorkloadState if s not in TERMINAL_STATES]


@dataclass(frozen=True)
class Limits:
    """The project's effective limits in one pool; a count limit of None on the project falls back to the tenant's."""

    pool: NodePool
    gpu_limit: int
    max_pending: int | None
    max_notebooks_per_user: int | None
    max_runtime_seconds: int | None


def fetch(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Return the rows of one read-only statement on the default database."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def placeholders(count: int) -> str:
    """Return `%s, %s, ...` for an IN list of `count` values."""
    return ", ".join(["%s"] * count)


def _table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


_LIMIT_COLUMNS = ("max_pending_workloads", "max_notebooks_per_user", "max_runtime_seconds")


def _limits_sql(pool_count: int) -> str:
    own = ", ".join(f"pq.{name}" for name in _LIMIT_COLUMNS)
    tenants = ", ".join(f"tq.{name}" for name in _LIMIT_COLUMNS)
    # Only the project's rows are locked; the tenant's limits are read as they stand, as the scheduler reads them.
    lock = " FOR UPDATE OF pq" if connection.features.has_select_for_update_of else ""
    tables = (
        f"{_table(ProjectQuota)} pq LEFT JOIN {_table(TenantQuota)} tq "
        "ON tq.tenant_id = pq.tenant_id AND tq.pool_id = pq.pool_id"
    )
    where = f"pq.project_id = %s AND pq.pool_id IN ({placeholders(pool_count)})"
    return f'SELECT pq.pool_id, pq."limit", {own}, {tenants} FROM {tables} WHERE {where} ORDER BY pq.pool_id{lock}'  # noqa: S608 -- names from the models' metadata; every value is a parameter


def lock_limits(project: Project, pools: Sequence[NodePool]) -> dict[int, Limits]:
    """Lock the project's quota rows in `pools` (in pool order) and return its limits by pool id.

    One query, the tenant's limits in the same pools joined in. Raises
    ValidationError on `pool` (rule `no_quota`) when the project has no
    quota in one of them.
    """
    by_id = {pool.pk: pool for pool in pools}
    rows = fetch(_limits_sql(len(by_id)), [project.pk, *sorted(by_id)])
    quotas = {row[0]: row for row in rows}
    for pool_id, pool in by_id.items():
        if pool_id not in quotas:
            raise invalid(
                "pool", "no_quota", f"Project {project.slug} has no quota in pool {pool.name}; ask a tenant admin."
            )
    return {pool_id: _limits(by_id[pool_id], row) for pool_id, row in quotas.items()}


def _limits(pool: NodePool, row: tuple[Any, ...]) -> Limits:
    _, limit, own_pending, own_notebooks, own_runtime, tenant_pending, tenant_notebooks, tenant_runtime = row
    return Limits(
        pool=pool,
        gpu_limit=limit,
        max_pending=own_pending if own_pending is not None else tenant_pending,
        max_notebooks_per_user=own_notebooks if own_notebooks is not None else tenant_notebooks,
        max_runtime_seconds=own_runtime if own_runtime is not None else tenant_runtime,
    )


def check_pool_open(specs: Sequence[WorkloadSpec], tenant_id: int, *, bulk: bool) -> None:
    """Raise ValidationError on `pool` (rule `pool_dedicated`) when a pool is dedicated to another tenant."""
    for index, spec in enumerate(specs):
        dedicated = spec.pool.dedicated_tenant_id
        if dedicated is not None and dedicated != tenant_id:
            error = invalid("pool", "pool_dedicated", f"Pool {spec.pool.name} is dedicated to another tenant.")
            raise _at(error, index, bulk)


def with_runtime_defaults(
    specs: Sequence[WorkloadSpec], limits: dict[int, Limits], *, bulk: bool
) -> list[WorkloadSpec]:
    """Return `specs` with an unset max runtime set to the quota's.

    Raises ValidationError on `max_runtime_seconds` (rule `above_max_runtime`) when one asks for more.
    """
    result: list[WorkloadSpec] = []
    for index, spec in enumerate(specs):
        cap = limits[spec.pool.pk].max_runtime_seconds
        if spec.max_runtime_seconds is None:
            # A copy only when there is a maximum to fill in: for a bulk submission the copies add up.
            spec = replace(spec, max_runtime_seconds=cap) if cap is not None else spec
        elif cap is not None and spec.max_runtime_seconds > cap:
            error = invalid(
                "max_runtime_seconds",
                "above_max_runtime",
                f"{spec.max_runtime_seconds} s exceeds the maximum runtime of {cap} s in pool {spec.pool.name}.",
            )
            raise _at(error, index, bulk)
        result.append(spec)
    return result


def check_gpu_limits(specs: Sequence[WorkloadSpec], limits: dict[int, Limits], project: Project, *, bulk: bool) -> None:
    """Raise ValidationError on `gpus_per_replica` (rule `above_quota_limit`) when one workload exceeds the limit.

    Only the workload alone is compared: what the project already holds is
    the scheduler's to weigh (the work waits with reason QUOTA_LIMIT).
    """
    for index, spec in enumerate(specs):
        limit = limits[spec.pool.pk].gpu_limit
        if spec.total_gpus > limit:
            error = invalid(
                "gpus_per_replica",
                "above_quota_limit",
                f"{spec.total_gpus} GPUs exceed project {project.slug}'s limit of {limit} in pool {spec.pool.name}.",
            )
            raise _at(error, index, bulk)


def check_placement(specs: Sequence[WorkloadSpec], *, bulk: bool) -> None:
    """Raise ValidationError when a workload asks for GPU models the pool lacks (`gpu_models`, rule
    `unknown_gpu_model`) or for more than the pool could ever place (`gpus_per_replica` or `replicas`,
    rule `exceeds_largest_placement`). One query for every pool of the submission.
    """
    gpu_specs = [(i, s) for i, s in enumerate(specs) if s.gpus_per_replica > 0]
    if not gpu_specs:
        return
    nodes = _gpus_by_node(sorted({s.pool.pk for _, s in gpu_specs}))
    for index, spec in gpu_specs:
        pool_nodes = nodes.get(spec.pool.pk, [])
        try:
            _check_models(spec, pool_nodes)
            _check_fits(spec, pool_nodes)
        except ValidationError as error:
            raise _at(error, index, bulk) from None


def _gpus_sql(pool_count: int) -> str:
    gone = placeholders(len(_GONE_NODE_STATES))
    tables = f"{_table(Gpu)} g JOIN {_table(Node)} n ON n.id = g.node_id"
    where = (
        f"g.present = %s AND g.health <> %s AND n.pool_id IN ({placeholders(pool_count)}) AND n.state NOT IN ({gone})"
    )
    columns = "n.pool_id, g.node_id, g.model"
    return f"SELECT {columns}, COUNT(*) FROM {tables} WHERE {where} GROUP BY {columns}"  # noqa: S608 -- names from the models' metadata; every value is a parameter


def _gpus_by_node(pool_ids: list[int]) -> dict[int, list[dict[str, int]]]:
    """Return {pool id: [{GPU model: count} per node]} of the GPUs that could ever be placed on."""
    params = [True, GpuHealth.FAILED.value, *pool_ids, *(state.value for state in _GONE_NODE_STATES)]
    per_node: dict[tuple[int, int], dict[str, int]] = defaultdict(dict)
    for pool_id, node_id, model, count in fetch(_gpus_sql(len(pool_ids)), params):
        per_node[(pool_id, node_id)][model] = count
    result: dict[int, list[dict[str, int]]] = defaultdict(list)
    for (pool_id, _), models in sorted(per_node.items()):
        result[pool_id].append(models)
    return result


def _check_models(spec: WorkloadSpec, nodes: list[dict[str, int]]) -> None:
    known = {model for node in nodes for model in node}
    unknown = sorted(set(spec.gpu_models) - known)
    if unknown:
        have = ", ".join(sorted(known)) or "none"
        raise invalid(
            "gpu_models",
            "unknown_gpu_model",
            f"Pool {spec.pool.name} has no {', '.join(unknown)} GPUs (it has: {have}).",
        )


def _check_fits(spec: WorkloadSpec, nodes: list[dict[str, int]]) -> None:
    wanted = set(spec.gpu_models)
    usable = [sum(n for model, n in node.items() if not wanted or model in wanted) for node in nodes]
    # Each replica runs on one node, so a node offers count // gpus_per_replica slots.
    slots = sum(count // spec.gpus_per_replica for count in usable)
    if spec.replicas == 1 and slots < 1:
        raise invalid(
            "gpus_per_replica",
            "exceeds_largest_placement",
            f"No node of pool {spec.pool.name} has {spec.gpus_per_replica} suitable GPUs; "
            f"the largest has {max(usable, default=0)}.",
        )
    if slots < spec.replicas:
        raise invalid(
            "replicas",
            "exceeds_largest_placement",
            f"Pool {spec.pool.name} can place at most {slots} replicas of {spec.gpus_per_replica} suitable GPUs; "
            f"{spec.replicas} were asked for.",
        )


def check_counts(specs: Sequence[WorkloadSpec], limits: dict[int, Limits], project: Project, owner: User) -> None:
    """Raise ValidationError when the submission would pass the project's pending limit (`project`, rule
    `max_pending_workloads`) or the owner's notebook limit (`kind`, rule `max_notebooks_per_user`) in a pool.

    One query whatever the number of items, and none when no limit concerns
    the submission: only pools with a pending limit are counted, and the
    owner's notebooks only where notebooks are submitted into a pool with a
    notebook limit. Partial indexes (pending per project and pool, live
    notebooks per owner) keep the count off the rest of the backlog.
    """
    new_items: dict[int, list[WorkloadSpec]] = defaultdict(list)
    for spec in specs:
        new_items[spec.pool.pk].append(spec)
    pending_pools = sorted(p for p, limit in limits.items() if limit.max_pending is not None)
    notebook_pools = sorted(
        p
        for p, limit in limits.items()
        if limit.max_notebooks_per_user is not None and any(s.kind == WorkloadKind.NOTEBOOK for s in new_items[p])
    )
    pending, notebooks = _counts(project, owner, pending_pools, notebook_pools)
    for pool_id, limit in limits.items():
        new = new_items[pool_id]
        new_notebooks = sum(1 for s in new if s.kind == WorkloadKind.NOTEBOOK)
        _check_cap("project", "max_pending_workloads", pending.get(pool_id, 0), len(new), limit.max_pending, limit)
        _check_cap(
            "kind",
            "max_notebooks_per_user",
            notebooks.get(pool_id, 0),
            new_notebooks,
            limit.max_notebooks_per_user,
            limit,
        )


def _counts(
    project: Project, owner: User, pending_pools: list[int], notebook_pools: list[int]
) -> tuple[dict[int, int], dict[int, int]]:
    """Return ({pool: the project's pending workloads}, {pool: the owner's live notebooks}) in one query."""
    if not pending_pools and not notebook_pools:
        return {}, {}
    is_pending = Q(state=WorkloadState.PENDING, pool_id__in=pending_pools)
    is_notebook = Q(owner=owner, kind=WorkloadKind.NOTEBOOK, state__in=_LIVE_STATES, pool_id__in=notebook_pools)
    rows = (
        Workload.all_tenants.filter(project=project)
        .filter(is_pending | is_notebook)
        .values("pool_id")
        .annotate(pending=Count("id", filter=is_pending), notebooks=Count("id", filter=is_notebook))
        .order_by()
    )
    counted = list(rows)
    return {r["pool_id"]: r["pending"] for r in counted}, {r["pool_id"]: r["notebooks"] for r in counted}


_CAP_MESSAGES = {
    "max_pending_workloads": (
        "The project has {have} pending workloads in pool {pool}; {new} more would pass its limit of {cap}."
    ),
    "max_notebooks_per_user": (
        "You have {have} notebooks in pool {pool}; {new} more would pass the limit of {cap} per user."
    ),
}


def _check_cap(field: str, rule: str, have: int, new: int, cap: int | None, limit: Limits) -> None:
    if new and cap is not None and have + new > cap:
        message = _CAP_MESSAGES[rule].format(have=have, new=new, cap=cap, pool=limit.pool.name)
        raise invalid(field, rule, message)


def _at(error: ValidationError, index: int, bulk: bool) -> ValidationError:
    """Key an item's error by its place in a bulk submission; a single submission keeps plain field names."""
    return prefixed(error, f"items[{index}].") if bulk else error
