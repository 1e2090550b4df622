"""Why a workload waits, in words its owner understands, and a hint where one is cheap to find."""

from __future__ import annotations

from jobs.scheduler.core.capacity import PoolCapacity
from jobs.scheduler.core.model import Reason, Workload
from jobs.scheduler.core.state import PassState, project_key, tenant_key


def _asks(workload: Workload) -> str:
    if workload.gpus == 0:
        return f"{workload.cpu_milli / 1000:g} CPUs and {workload.memory_mib} MiB of memory"
    if workload.replicas == 1:
        return f"{workload.gpus} GPU{'s' if workload.gpus != 1 else ''}"
    return f"{workload.replicas} replicas of {workload.gpus} GPU{'s' if workload.gpus != 1 else ''} each"


def _models(workload: Workload) -> str:
    return " or ".join(sorted(workload.models)) if workload.models else "any model"


def _free_for(capacity: PoolCapacity, workload: Workload, models: tuple[str, ...]) -> tuple[int, int]:
    """Return (free GPUs of `models` in all, most on one node) on the nodes that can mount the workload's volumes."""
    excluded = capacity.mounts.excluded(workload.storage)
    if not excluded:
        return capacity.free_gpus(models), capacity.largest_free(models)
    counts = [len(node.free.get(m, ())) for node in capacity.nodes if node.number not in excluded for m in models]
    return sum(counts), max(counts, default=0)


def quota_message(state: PassState, workload: Workload) -> str | None:
    """Return why the workload would break its tenant's or project's limit, or None when it would not."""
    gpus = workload.total_gpus
    tenant = tenant_key(workload)
    limit = state.tenant_quota(tenant).limit
    if state.tenant_usage[tenant] + gpus > limit:
        if tenant not in state.tenant_limits:
            return f"Tenant {workload.tenant} has no GPU quota in pool {workload.pool}."
        return (
            f"Tenant {workload.tenant} already uses {state.tenant_usage[tenant]} of its limit of {limit:g} GPUs "
            f"in pool {workload.pool}; this workload asks for {_asks(workload)}."
        )
    project = project_key(workload)
    limit = state.project_quota(project).limit
    if state.project_usage[project] + gpus > limit:
        return (
            f"Project {workload.project} already uses {state.project_usage[project]} of its limit of {limit:g} GPUs "
            f"in pool {workload.pool}; this workload asks for {_asks(workload)}."
        )
    return None


def message(reason: Reason, workload: Workload, detail: str = "") -> str:
    """Return the sentence shown to the workload's owner for `reason` (`detail` completes some of them)."""
    pool, asks = workload.pool, _asks(workload)
    sentences = {
        Reason.QUOTA_LIMIT: detail,
        Reason.BUDGET: detail,
        Reason.UNKNOWN_POOL: f"Pool {pool} does not exist.",
        Reason.POOL_CORDONED: f"Pool {pool} is cordoned by the operators: nothing new starts there until it reopens.",
        Reason.DEDICATED_POOL: f"Pool {pool} is dedicated to another tenant.",
        Reason.NO_CAPACITY_FOR_MODEL: (
            f"Pool {pool} does not have enough healthy GPUs of {_models(workload)} to ever hold {asks}."
        ),
        Reason.GANG_CANNOT_FIT: (
            f"Enough GPUs are free in pool {pool}, but not together on few enough nodes to hold {asks} at once."
            + (f" {detail}" if detail else "")
        ),
        Reason.NO_CAPACITY: f"Pool {pool} has no room for {asks} right now; it starts when running work finishes.",
        Reason.WAITING_FOR_FAIRER_WORK: (
            f"The free GPUs of pool {pool} went to teams further below their fair share; your turn comes next."
        ),
        Reason.WAITING_FOR_HIGHER_PRIORITY: (
            f"Higher-priority work of project {workload.project} took the free GPUs of pool {pool} first."
        ),
        Reason.BEHIND_QUEUE_HEAD: f"Waiting in first-in, first-out order behind {detail} in pool {pool}.",
        Reason.NO_STORAGE: (
            f"None of the nodes of pool {pool} that could hold {asks} can mount its volumes "
            f"(backends: {', '.join(sorted(workload.storage))})."
        ),
    }
    return sentences.get(reason, reason.value)


# Said of a gang that does not fit where some nodes of its pool may not hold a gang together (core.fabric).
SPAN_NOTE = (
    "Its replicas can run on different nodes only when those nodes are in one Docker swarm with a manager among them."
)


def capacity_detail(capacity: PoolCapacity, reason: Reason) -> str:
    """Return what completes the sentence of a capacity `reason` in this pool, or ""."""
    return SPAN_NOTE if reason is Reason.GANG_CANNOT_FIT and capacity.fabrics.restricted else ""


def capacity_reason(capacity: PoolCapacity, workload: Workload, models: tuple[str, ...]) -> Reason:
    """Return why a workload that passed its quota does not fit in its pool's free capacity.

    The pool's GPU models come first (NO_CAPACITY_FOR_MODEL), then the nodes
    that can mount its volumes (NO_STORAGE: those could never hold it), then
    what is free on those nodes now.
    """
    if workload.replicas > 1 and capacity.fabrics.restricted and capacity.fits_unshared(workload, models):
        return Reason.GANG_CANNOT_FIT  # room enough, but only on nodes that may not hold the gang together
    if workload.gpus == 0:
        return Reason.NO_STORAGE if capacity.mounts.never_holds(workload, models) else Reason.NO_CAPACITY
    if not models or max(capacity.largest_node_by_model.get(m, 0) for m in models) < workload.gpus:
        return Reason.NO_CAPACITY_FOR_MODEL
    if sum(capacity.capacity_by_model.get(m, 0) for m in models) < workload.total_gpus:
        return Reason.NO_CAPACITY_FOR_MODEL
    if capacity.mounts.never_holds(workload, models):
        return Reason.NO_STORAGE
    if workload.total_gpus > 1 and _free_for(capacity, workload, models)[0] >= workload.total_gpus:
        return Reason.GANG_CANNOT_FIT
    return Reason.NO_CAPACITY


class Hints:
    """Hints for the workloads left waiting once a pass has placed everything it will.

    Free capacity no longer changes then, so whether a shape fits a pool is
    searched once per (pool, shape) however many workloads share it; quotas
    and pool rules are a few lookups per workload.
    """

    def __init__(self, state: PassState) -> None:
        self.state = state
        self._fits: dict[tuple[str, tuple[tuple[str, ...], int, int, int, int, frozenset[str]]], bool] = {}

    def hint(self, workload: Workload, reason: Reason) -> str | None:
        """Return "would start now in pool <name>", "... with <n> GPUs" or which backends it could use; else None.

        Another pool qualifies when the workload's tenant may use it (not
        dedicated to another tenant, not cordoned, a tenant quota there and
        room under both the tenant's and the project's limit, and no used-up
        budget holds it back there), some GPU model
        there is one the workload accepts, and the whole gang fits its free
        capacity as this pass leaves it, on nodes that can mount its volumes.
        Pools are tried by name. Failing that, a workload waiting for
        NO_STORAGE is told which backends the nodes of its pool that could
        hold it can mount; a single replica that asks for more GPUs than any
        node (that can mount its volumes) has free is told how many it could
        have now.
        """
        for name, capacity in self.state.capacity.items():
            if name != workload.pool and may_use(self.state, workload, name) and self._fits_in(capacity, workload):
                return f"would start now in pool {name}"
        own = self.state.capacity.get(workload.pool)
        if own is not None and reason is Reason.NO_STORAGE:
            backends = own.mounts.backends_for(workload, own.accepted(workload.models))
            return f"nodes of pool {workload.pool} that could hold it mount {', '.join(backends)}" if backends else None
        if own is None or workload.replicas != 1 or workload.gpus <= 1:
            return None
        fewer = _free_for(own, workload, own.accepted(workload.models))[1]
        if 0 < fewer < workload.gpus:
            return f"would start now with {fewer} GPU{'s' if fewer != 1 else ''}"
        return None

    def _fits_in(self, capacity: PoolCapacity, workload: Workload) -> bool:
        models = capacity.accepted(workload.models)
        shape = (models, workload.gpus, workload.replicas, workload.cpu_milli, workload.memory_mib, workload.storage)
        key = (capacity.name, shape)
        if key not in self._fits:
            self._fits[key] = _fits_now(capacity, models, workload)
        return self._fits[key]


def _fits_now(capacity: PoolCapacity, models: tuple[str, ...], workload: Workload) -> bool:
    """Return whether the whole gang fits free capacity now, on nodes that mount its volumes; nothing stays taken."""
    if workload.gpus and (
        not models or capacity.free_gpus(models) < workload.total_gpus or capacity.largest_free(models) < workload.gpus
    ):
        return False  # counts alone rule it out: no search
    excluded = capacity.mounts.excluded(workload.storage)
    takes = capacity.place_gang(
        models, workload.gpus, workload.replicas, workload.cpu_milli, workload.memory_mib, excluded
    )
    for take in reversed(takes or ()):
        capacity.give(take)
    return takes is not None


def may_use(state: PassState, workload: Workload, pool_name: str) -> bool:
    """Return whether the workload's tenant and project could start it in `pool_name` as far as rules and quotas go."""
    pool = state.pools[pool_name]
    if pool.cordoned or pool.dedicated_tenant not in (None, workload.tenant):
        return False
    tenant = (pool_name, workload.tenant)
    project = (pool_name, workload.tenant, workload.project)
    gpus = workload.total_gpus
    return (
        tenant in state.tenant_limits
        and state.tenant_usage.get(tenant, 0) + gpus <= state.tenant_quota(tenant).limit
        and state.project_usage.get(project, 0) + gpus <= state.project_quota(project).limit
        and (not state.budgets or state.budgets.blocks(state, workload, pool_name) is None)
    )
