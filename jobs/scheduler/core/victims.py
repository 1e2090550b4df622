"""Who may lose work to a claimant, and in which order victims are taken.

Only owners above their fair share lose work to a claimant within its
guarantee, never below their own guarantee; inside a project, higher priority
preempts lower. Nothing younger than `min_runtime_s` is preempted, nor a
notebook while its project is within its guarantee, nor a workload already
preempted `max_preemptions` times (it is protected from then on).

Victims are ordered lowest priority first, then by the least work a
preemption throws away: the latest save point first (`model.last_saved_at`:
the victim's latest checkpoint of its current attempt, else its start), then
the id. Among victims of the same priority and size that is the one losing
the fewest GPU-seconds (`model.lost_work`); sizes are weighed before the
order, by reclaim's rules (fewest GPUs freed). Without checkpoints the latest
save point is the latest start: newest first, the order before checkpoints
were known, so decisions are unchanged; `SchedulerConfig.checkpoint_aware`
off keeps newest first whatever the checkpoints.
"""

from __future__ import annotations

from jobs.scheduler.core.model import Reason, Workload, WorkloadKind, last_saved_at
from jobs.scheduler.core.state import PassState, project_key, tenant_key

_EPSILON = 1e-9


def victim_order(workload: Workload) -> tuple[int, float, str]:
    """Return the sort key putting the lowest-priority workloads first, then those whose progress was saved last."""
    return (workload.priority, -(last_saved_at(workload) or 0.0), workload.id)


def newest_first(workload: Workload) -> tuple[int, float, str]:
    """Return the sort key putting the lowest-priority, newest workloads first (checkpoints ignored)."""
    return (workload.priority, -(workload.started_at or 0.0), workload.id)


def preemption_reason(state: PassState, claimant: Workload, victim: Workload) -> Reason | None:
    """Return why `victim` may be preempted for `claimant` now, or None when it may not."""
    if victim.id in state.preempted or victim.started_at is None:
        return None
    if state.now - victim.started_at < state.config.min_runtime_s or _protected_notebook(state, victim):
        return None
    if victim.preemptions >= state.config.max_preemptions:
        return None
    if victim.tenant == claimant.tenant and victim.project == claimant.project:
        return Reason.PRIORITY if victim.priority < claimant.priority else None
    if not owner_above_fair_share(state, claimant, victim) or not state.within_guarantee(claimant):
        return None
    if victim.tenant != claimant.tenant:
        key = tenant_key(victim)
        usage, quota = state.tenant_usage[key], state.tenant_quota(key)
    else:
        pkey = project_key(victim)
        usage, quota = state.project_usage[pkey], state.project_quota(pkey)
    # Only owners above their fair share lose work, and never below their own guarantee.
    return Reason.RECLAIM_GUARANTEE if usage - victim.total_gpus >= quota.guaranteed else None


def owner_above_fair_share(state: PassState, claimant: Workload, victim: Workload) -> bool:
    """Return whether the victim's owner (another tenant, or a sibling project) is above its fair share."""
    if victim.tenant != claimant.tenant:
        key = tenant_key(victim)
        return state.tenant_usage[key] > state.tenant_fair.get(key, 0.0) + _EPSILON
    pkey = project_key(victim)
    return state.project_usage[pkey] > state.project_fair.get(pkey, 0.0) + _EPSILON


def within_limits(state: PassState, workload: Workload) -> bool:
    """Return whether placing the workload keeps its tenant and project within their limits."""
    tenant, project = tenant_key(workload), project_key(workload)
    return (
        state.tenant_usage[tenant] + workload.total_gpus <= state.tenant_quota(tenant).limit
        and state.project_usage[project] + workload.total_gpus <= state.project_quota(project).limit
    )


def _protected_notebook(state: PassState, victim: Workload) -> bool:
    key = project_key(victim)
    return victim.kind is WorkloadKind.NOTEBOOK and state.project_usage[key] <= state.project_quota(key).guaranteed
