"""Orders of pending work: decayed usage in the fair-share rank, shortest work first, and Slurm's multifactor.

- **History** (`History`): an owner's decayed past usage (`Snapshot.usage`) as
  a share of all decayed usage in the pool, over the share it is entitled to
  (its guarantee's share of all guarantees, else its weight's): 1 at its
  entitlement, 2 when it used twice its share. The fair-share rank adds it,
  times `SchedulerConfig.history_weight`, to usage over fair share now, so an
  owner that just used far more than its share yields to one that did not.
- **Shortest work first** (`shortest_first`): inside a project, work with the
  least planned GPU-time (GPUs x planned run time) goes first, which lowers
  mean completion time (SRPT, as Tiresias does with attained service). Work
  with no limit and no prediction goes behind known work, in submission
  order (nothing says it is short). Waiting ages
  the key, so long work moves up as it waits; nothing starves in any case,
  since the most starved workload gets a reservation (`engine`).
- **Slurm's multifactor** (`slurm_priority`): the `slurm` baseline, a weighted
  sum of three factors in [0, 1]: age (wait over PriorityMaxAge), job size
  (PriorityFavorSmall: 1 for the smallest, falling with the share of the pool
  asked) and fair share, the classic 2^(-U/S) with U the owner's decayed usage
  share and S its normalised shares (here its guarantee's share).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from jobs.scheduler.core.model import OwnerUsage, SchedulerConfig, Workload, planned_run_s

# Waiting three days halves a workload's shortest-first key (and so on): long work moves up as it waits.
AGING_S = 259_200.0

Key = tuple[str, str, str | None]  # (pool, tenant, project or None)


class History:
    """Decayed usage shares of each owner against its entitlement, per pool."""

    def __init__(self, usage: Iterable[OwnerUsage], entitled: dict[Key, float]) -> None:
        totals: dict[tuple[str, str | None], float] = defaultdict(float)
        used: dict[Key, float] = {}
        for item in usage:
            key = (item.pool, item.tenant, item.project)
            used[key] = used.get(key, 0.0) + max(0.0, item.gpu_seconds)
            # Tenants share a pool; projects share their tenant: each total is over its siblings.
            totals[(item.pool, None if item.project is None else item.tenant)] += max(0.0, item.gpu_seconds)
        self.ratios: dict[Key, float] = {}
        for key, gpu_seconds in used.items():
            pool, tenant, project = key
            total = totals[(pool, None if project is None else tenant)]
            share, entitled_share = (gpu_seconds / total if total > 0 else 0.0), entitled.get(key, 0.0)
            if share > 0:
                self.ratios[key] = share / entitled_share if entitled_share > 0 else math.inf
        self.shares = {
            key: used[key] / totals[(key[0], None)] for key in used if key[2] is None and totals[(key[0], None)]
        }

    def ratio(self, pool: str, tenant: str, project: str | None = None) -> float:
        """Return the owner's decayed usage share over its entitled share (0 without history)."""
        return self.ratios.get((pool, tenant, project), 0.0)

    def share(self, pool: str, tenant: str) -> float:
        """Return the tenant's share of all decayed usage in the pool (0 without history)."""
        return self.shares.get((pool, tenant, None), 0.0)


def entitlements(quotas: Iterable[tuple[Key, float, float]]) -> dict[Key, float]:
    """Return each owner's entitled share among its siblings from (key, guaranteed, weight).

    Guarantees decide where any sibling has one; weights otherwise.
    """
    groups: dict[tuple[str, str | None], list[tuple[Key, float, float]]] = defaultdict(list)
    for key, guaranteed, weight in quotas:
        groups[(key[0], None if key[2] is None else key[1])].append((key, guaranteed, weight))
    shares: dict[Key, float] = {}
    for members in groups.values():
        total_guaranteed = sum(max(0.0, g) for _, g, _ in members)
        total_weight = sum(max(0.0, w) for _, _, w in members)
        for key, guaranteed, weight in members:
            if total_guaranteed > 0:
                shares[key] = max(0.0, guaranteed) / total_guaranteed
            elif total_weight > 0:
                shares[key] = max(0.0, weight) / total_weight
    return shares


def shortest_first(workload: Workload, now: float) -> tuple[int, float, float, str]:
    """Return the sort key inside a project: priority, then planned GPU-time aged by waiting, then submission."""
    run = planned_run_s(workload)
    area = math.inf if run is None else max(workload.total_gpus, 1) * run
    waited = max(0.0, now - workload.submitted_at)
    return (-workload.priority, area / (1.0 + waited / AGING_S), workload.submitted_at, workload.id)


def slurm_priority(
    workload: Workload, now: float, pool_gpus: int, config: SchedulerConfig, history: History, entitled: float
) -> float:
    """Return the `slurm` baseline's multifactor priority of a pending workload (higher goes first)."""
    weights = config.slurm
    age = min(1.0, max(0.0, now - workload.submitted_at) / weights.max_age_s) if weights.max_age_s > 0 else 1.0
    asked = min(1.0, workload.total_gpus / pool_gpus) if pool_gpus else 1.0
    size = 1.0 - asked if weights.favor_small else asked
    used = history.share(workload.pool, workload.tenant)
    fairshare = 2.0 ** (-used / entitled) if entitled > 0 else 0.0
    return weights.age * age + weights.job_size * size + weights.fairshare * fairshare
