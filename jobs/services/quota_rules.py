"""Submission rules that read the ledger: quotas, count limits, the pool's GPU models and largest placement,
and budgets.

The reads (`limits_of`, `gpus_by_node`, `load_counts`) fetch what every
item of a batch of submissions needs in one set-based query each, whatever
the number of items. Each check then takes one workload (the counts: one
submission) and raises ValidationError naming the field and the rule, so
the caller can report every item's failures at once
(`jobs.services.submission.checks`). The caller holds the lock on the
project's quota rows where a count limit applies, so the counts cannot
change under it.

The reads every submission makes (the locked limits, the pool's GPUs) are
written in SQL, in `jobs.fast_sql` (the fast path `jobs_sql`): building the
same queries with the ORM made query construction the largest part of a
single submission (bench/submissions.py). The pending and notebook counts
are the ORM's: its best form is as fast as the statements were
(bench/fast_sql.py, docs/fastpaths.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Count
from django.utils import timezone

from common.errors import invalid
from inventory.choices import GpuHealth, NodeState
from inventory.models import NodePool
from jobs import fast_sql
from jobs.accounting_port import accounting
from jobs.choices import TERMINAL_STATES, WorkloadKind, WorkloadState
from jobs.models import Workload
from jobs.services.spec import WorkloadSpec
from tenants.models import Project

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

    @property
    def counted(self) -> bool:
        """Whether a count limit applies: then submissions must take turns to be held to it."""
        return self.max_pending is not None or self.max_notebooks_per_user is not None


def limits_of(pairs: Collection[tuple[int, NodePool]], *, lock: bool) -> dict[tuple[int, int], Limits]:
    """Return the limits of these (project id, pool) pairs by (project id, pool id), with `lock` locking
    their quota rows (in (project, pool) order, so that lockers never deadlock).

    One query for any number of projects and pools, the tenants' limits in
    the same pools joined in. A pair without a quota row is left out of the
    result.
    """
    pools = {pool.pk: pool for _, pool in pairs}
    keys = sorted({(project_id, pool.pk) for project_id, pool in pairs})
    if not keys:
        return {}
    rows = fast_sql.quota_limits(keys, lock=lock)
    return {(row[0], row[1]): _limits(pools[row[1]], row[1:]) for row in rows}


def check_quotas_exist(project: Project, pools: Sequence[NodePool], limits: Mapping[int, Limits]) -> None:
    """Raise ValidationError on `pool` (rule `no_quota`) when the project has no quota in one of `pools`."""
    for pool in pools:
        if pool.pk not in limits:
            raise invalid(
                "pool", "no_quota", f"Project {project.slug} has no quota in pool {pool.name}; ask a tenant admin."
            )


def lock_limits(project: Project, pools: Sequence[NodePool]) -> dict[int, Limits]:
    """Lock the project's quota rows in `pools` (in pool order) and return its limits by pool id.

    One query, the tenant's limits in the same pools joined in. Raises
    ValidationError on `pool` (rule `no_quota`) when the project has no
    quota in one of them.
    """
    found = limits_of([(project.pk, pool) for pool in pools], lock=True)
    limits = {pool_id: limit for (_, pool_id), limit in found.items()}
    check_quotas_exist(project, pools, limits)
    return limits


def _limits(pool: NodePool, row: tuple[Any, ...]) -> Limits:
    _, limit, own_pending, own_notebooks, own_runtime, tenant_pending, tenant_notebooks, tenant_runtime = row
    return Limits(
        pool=pool,
        gpu_limit=limit,
        max_pending=own_pending if own_pending is not None else tenant_pending,
        max_notebooks_per_user=own_notebooks if own_notebooks is not None else tenant_notebooks,
        max_runtime_seconds=own_runtime if own_runtime is not None else tenant_runtime,
    )


def check_pool_open(spec: WorkloadSpec, tenant_id: int) -> None:
    """Raise ValidationError on `pool` (rule `pool_dedicated`) when the spec's pool is dedicated to another tenant."""
    dedicated = spec.pool.dedicated_tenant_id
    if dedicated is not None and dedicated != tenant_id:
        raise invalid("pool", "pool_dedicated", f"Pool {spec.pool.name} is dedicated to another tenant.")


def with_runtime_default(spec: WorkloadSpec, limit: Limits) -> WorkloadSpec:
    """Return `spec` with an unset max runtime set to the quota's (`limit`, in the spec's pool).

    Raises ValidationError on `max_runtime_seconds` (rule `above_max_runtime`) when it asks for more.
    """
    cap = limit.max_runtime_seconds
    if spec.max_runtime_seconds is None:
        # A copy only when there is a maximum to fill in: for a bulk submission the copies add up.
        return replace(spec, max_runtime_seconds=cap) if cap is not None else spec
    if cap is not None and spec.max_runtime_seconds > cap:
        raise invalid(
            "max_runtime_seconds",
            "above_max_runtime",
            f"{spec.max_runtime_seconds} s exceeds the maximum runtime of {cap} s in pool {spec.pool.name}.",
        )
    return spec


def check_gpu_limit(spec: WorkloadSpec, limit: Limits, project: Project) -> None:
    """Raise ValidationError on `gpus_per_replica` (rule `above_quota_limit`) when the workload alone exceeds
    the project's GPU limit in its pool (`limit`).

    What the project already holds is the scheduler's to weigh (the work
    waits with reason QUOTA_LIMIT).
    """
    if spec.total_gpus > limit.gpu_limit:
        raise invalid(
            "gpus_per_replica",
            "above_quota_limit",
            f"{spec.total_gpus} GPUs exceed project {project.slug}'s limit of {limit.gpu_limit} "
            f"in pool {spec.pool.name}.",
        )


def check_placement(spec: WorkloadSpec, nodes: Mapping[int, list[dict[str, int]]]) -> None:
    """Raise ValidationError when the workload asks for GPU models its pool lacks (`gpu_models`, rule
    `unknown_gpu_model`) or for more than the pool could ever place (`gpus_per_replica` or `replicas`,
    rule `exceeds_largest_placement`). `nodes` is `gpus_by_node` of (at least) the spec's pool.
    """
    if spec.gpus_per_replica > 0:
        pool_nodes = nodes.get(spec.pool.pk, [])
        _check_models(spec, pool_nodes)
        _check_fits(spec, pool_nodes)


def gpus_by_node(pool_ids: Sequence[int]) -> dict[int, list[dict[str, int]]]:
    """Return {pool id: [{GPU model: count} per node]} of the GPUs that could ever be placed on."""
    gone = [state.value for state in _GONE_NODE_STATES]
    rows = fast_sql.gpu_counts(pool_ids, failed=GpuHealth.FAILED.value, gone_node_states=gone) if pool_ids else []
    per_node: dict[tuple[int, int], dict[str, int]] = defaultdict(dict)
    for pool_id, node_id, model, count in rows:
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


@dataclass
class Counts:
    """What count limits compare against: pending workloads per (project, pool) and live notebooks per
    (project, owner, pool), as read under the quota rows' lock and grown by what this transaction adds."""

    pending: dict[tuple[int, int], int] = field(default_factory=dict)
    notebooks: dict[tuple[int, int, int], int] = field(default_factory=dict)

    def add(self, specs: Sequence[WorkloadSpec], project: Project, owner: User) -> None:
        """Count `specs`, just accepted into `project` for `owner`, for the submissions after them."""
        for spec in specs:
            key = (project.pk, spec.pool.pk)
            self.pending[key] = self.pending.get(key, 0) + 1
            if spec.kind == WorkloadKind.NOTEBOOK:
                owned = (project.pk, owner.pk, spec.pool.pk)
                self.notebooks[owned] = self.notebooks.get(owned, 0) + 1


@dataclass(frozen=True)
class CountNeed:
    """One submission's share of what `load_counts` reads."""

    specs: Sequence[WorkloadSpec]
    limits: Mapping[int, Limits]
    project: Project
    owner: User


def _needed(need: CountNeed) -> tuple[set[tuple[int, int]], set[tuple[int, int, int]]]:
    """Return the (project, pool) pending counts and (project, owner, pool) notebook counts a limit concerns."""
    pending = {(need.project.pk, p) for p, limit in need.limits.items() if limit.max_pending is not None}
    notebook_pools = {s.pool.pk for s in need.specs if s.kind == WorkloadKind.NOTEBOOK}
    notebooks = {
        (need.project.pk, need.owner.pk, p) for p in notebook_pools if need.limits[p].max_notebooks_per_user is not None
    }
    return pending, notebooks


def load_counts(needs: Sequence[CountNeed]) -> Counts:
    """Read the counts every submission in `needs` is limited by: one query each for pending workloads and
    live notebooks, and none when no limit concerns them. Partial indexes (pending per project and pool,
    live notebooks per owner) keep the counts off the rest of the backlog."""
    pending: set[tuple[int, int]] = set()
    notebooks: set[tuple[int, int, int]] = set()
    for need in needs:
        more_pending, more_notebooks = _needed(need)
        pending |= more_pending
        notebooks |= more_notebooks
    counts = Counts()
    if pending:
        counts.pending = _pending_counts(pending)
    if notebooks:
        live = [state.value for state in _LIVE_STATES]
        counts.notebooks = _notebook_counts(notebooks, states=live)
    return counts


def _pending_counts(keys: Collection[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """Return the number of pending workloads per (project id, pool id) of `keys`; a key with none is left out.

    One query (the partial index `workload_pending_per_project` serves it), `__in` on each column and the
    pairs picked here: 0.68 ms for 32 keys, where OR-ing the pairs took 3 ms (the hand-written statement it
    replaced: 0.58 ms). Locks nothing.
    """
    found = (
        Workload.all_tenants.filter(
            state=WorkloadState.PENDING,
            project_id__in={project for project, _ in keys},
            pool_id__in={pool for _, pool in keys},
        )
        .values_list("project_id", "pool_id")
        .annotate(count=Count("*"))
        .order_by()
    )
    return {(project, pool): count for project, pool, count in found if (project, pool) in keys}


def _notebook_counts(
    keys: Collection[tuple[int, int, int]], *, states: Collection[str]
) -> dict[tuple[int, int, int], int]:
    """Return the number of notebooks in one of `states` per (project id, owner id, pool id) of `keys`; a key
    with none is left out.

    One query (the partial index `workload_live_notebooks` serves it), `__in` on each column and the keys
    picked here, as fast as the hand-written statement it replaced (bench/fast_sql.py). Locks nothing.
    """
    found = (
        Workload.all_tenants.filter(
            kind=WorkloadKind.NOTEBOOK,
            state__in=list(states),
            project_id__in={key[0] for key in keys},
            owner_id__in={key[1] for key in keys},
            pool_id__in={key[2] for key in keys},
        )
        .values_list("project_id", "owner_id", "pool_id")
        .annotate(count=Count("*"))
        .order_by()
    )
    return {(p, o, q): n for p, o, q, n in found if (p, o, q) in keys}


def check_counts(
    specs: Sequence[WorkloadSpec],
    limits: Mapping[int, Limits],
    project: Project,
    owner: User,
    counts: Counts | None = None,
) -> None:
    """Raise ValidationError when the submission would pass the project's pending limit (`project`, rule
    `max_pending_workloads`) or the owner's notebook limit (`kind`, rule `max_notebooks_per_user`) in a pool.

    Compares with `counts` (from `load_counts`) when given, else reads them:
    at most two queries whatever the number of items, and none when no
    limit concerns the submission.
    """
    if counts is None:
        counts = load_counts([CountNeed(specs, limits, project, owner)])
    new_items: dict[int, list[WorkloadSpec]] = defaultdict(list)
    for spec in specs:
        new_items[spec.pool.pk].append(spec)
    for pool_id, limit in limits.items():
        new = new_items[pool_id]
        new_notebooks = sum(1 for s in new if s.kind == WorkloadKind.NOTEBOOK)
        have_pending = counts.pending.get((project.pk, pool_id), 0)
        have_notebooks = counts.notebooks.get((project.pk, owner.pk, pool_id), 0)
        _check_cap("project", "max_pending_workloads", have_pending, len(new), limit.max_pending, limit)
        _check_cap("kind", "max_notebooks_per_user", have_notebooks, new_notebooks, limit.max_notebooks_per_user, limit)


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


def used_up_budgets(projects: Collection[Project]) -> dict[int, str]:
    """Return, by project id, the sentence describing the used-up budget that refuses new work into each of
    `projects` that has one: its own or its tenant's, with a hard action of refuse_new or more. A few queries
    for the whole batch, one when no such budget exists (asked of accounting: `jobs.accounting_port`)."""
    return accounting().refusing_new_work(projects, now=timezone.now())


def check_budget(project: Project, used_up: Mapping[int, str]) -> None:
    """Raise ValidationError on `project` (rule `budget_exhausted`) when a used-up budget refuses new work
    into it (`used_up` from `used_up_budgets`)."""
    described = used_up.get(project.pk)
    if described is not None:
        raise invalid(
            "project",
            "budget_exhausted",
            f"{described}: it is used up, and new work is refused until it is raised or its period "
            "ends. Ask for more on the requests page.",
        )
