"""The mutable working state of one pass: capacity per pool, usage and fair shares per owner, decisions so far."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from jobs.scheduler.core.budgets import BudgetCaps
from jobs.scheduler.core.capacity import PoolCapacity, Take
from jobs.scheduler.core.fairshare import Claim, water_fill
from jobs.scheduler.core.model import Node, Pool, Preemption, ReplicaAllocation, Snapshot, Workload
from jobs.scheduler.core.priority import History, entitlements

# (pool, tenant) and (pool, tenant, project): projects are named within their tenant.
TenantKey = tuple[str, str]
ProjectKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Limits:
    """An owner's quota in one pool, in GPUs."""

    guaranteed: float
    limit: float
    weight: float


_NO_QUOTA = Limits(0.0, 0.0, 0.0)


def tenant_key(workload: Workload) -> TenantKey:
    """Return the (pool, tenant) a workload is accounted to."""
    return (workload.pool, workload.tenant)


def project_key(workload: Workload) -> ProjectKey:
    """Return the (pool, tenant, project) a workload is accounted to."""
    return (workload.pool, workload.tenant, workload.project)


class PassState:
    """Everything a pass mutates; built from a snapshot, read back into `Decisions` at the end."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.now = snapshot.now
        self.config = snapshot.config
        self.budgets = BudgetCaps(snapshot.budgets)
        self.pools: dict[str, Pool] = {pool.name: pool for pool in snapshot.pools}
        self.tenant_limits: dict[TenantKey, Limits] = {
            (q.pool, q.tenant): Limits(float(q.guaranteed), float(q.limit), float(q.weight))
            for q in snapshot.tenant_quotas
        }
        self.project_limits: dict[ProjectKey, Limits] = {
            (q.pool, q.tenant, q.project): Limits(float(q.guaranteed), float(q.limit), float(q.weight))
            for q in snapshot.project_quotas
        }
        self.entitled = entitlements(
            [((q.pool, q.tenant, None), float(q.guaranteed), float(q.weight)) for q in snapshot.tenant_quotas]
            + [((q.pool, q.tenant, q.project), float(q.guaranteed), float(q.weight)) for q in snapshot.project_quotas]
        )
        self.history = History(snapshot.usage, self.entitled)
        self.tenant_usage: dict[TenantKey, int] = defaultdict(int)
        self.project_usage: dict[ProjectKey, int] = defaultdict(int)
        tenant_usage, project_usage = self.tenant_usage, self.project_usage
        allocated: set[str] = set()
        for workload in snapshot.running:  # thousands of them: one loop, no helper calls
            gpus = workload.gpus * workload.replicas
            tenant_usage[(workload.pool, workload.tenant)] += gpus
            project_usage[(workload.pool, workload.tenant, workload.project)] += gpus
            for replica in workload.allocation:
                allocated.update(replica.gpu_uuids)
        self.capacity = self._build_capacity(snapshot, allocated)
        self.tenant_fair: dict[TenantKey, float] = {}
        self.project_fair: dict[ProjectKey, float] = {}
        self._compute_fair_shares(snapshot)
        self.placements: dict[str, tuple[ReplicaAllocation, ...]] = {}
        self.preemptions: list[Preemption] = []
        self.preempted: set[str] = set()
        # The highest priority placed this pass per project: tells "behind higher priority" from "behind fairer".
        self.placed_priority: dict[ProjectKey, int] = {}

    def _build_capacity(self, snapshot: Snapshot, allocated: set[str]) -> dict[str, PoolCapacity]:
        nodes_by_pool: dict[str, list[Node]] = defaultdict(list)
        for node in snapshot.nodes:
            if node.schedulable:
                nodes_by_pool[node.pool].append(node)
        return {
            name: PoolCapacity(name, pool.policy, nodes_by_pool.get(name, []), allocated)
            for name, pool in sorted(self.pools.items())
            if not pool.cordoned
        }

    def tenant_quota(self, key: TenantKey) -> Limits:
        """Return a tenant's quota in a pool; a tenant without one may use no GPUs there."""
        return self.tenant_limits.get(key, _NO_QUOTA)

    def project_quota(self, key: ProjectKey) -> Limits:
        """Return a project's quota in a pool; a project without one falls back to its tenant's."""
        return self.project_limits.get(key) or self.tenant_quota((key[0], key[1]))

    def _compute_fair_shares(self, snapshot: Snapshot) -> None:
        tenant_demand: dict[TenantKey, int] = defaultdict(int, self.tenant_usage)
        project_demand: dict[ProjectKey, int] = defaultdict(int, self.project_usage)
        for workload in snapshot.pending:
            tenant_demand[tenant_key(workload)] += workload.total_gpus
            project_demand[project_key(workload)] += workload.total_gpus
        for key in self.tenant_limits:
            tenant_demand.setdefault(key, 0)
        for name, capacity in self.capacity.items():
            tenants = sorted(key[1] for key in tenant_demand if key[0] == name)
            claims = [self._claim(t, self.tenant_quota((name, t)), tenant_demand[(name, t)]) for t in tenants]
            shares = water_fill(float(sum(capacity.capacity_by_model.values())), claims)
            for tenant, share in shares.items():
                self.tenant_fair[(name, tenant)] = share
                projects = sorted(k[2] for k in project_demand if k[0] == name and k[1] == tenant)
                keys = [(name, tenant, project) for project in projects]
                claims = [self._claim(k[2], self.project_quota(k), project_demand[k]) for k in keys]
                for project, project_share in water_fill(share, claims).items():
                    self.project_fair[(name, tenant, project)] = project_share

    @staticmethod
    def _claim(key: str, limits: Limits, demand: int) -> Claim:
        return Claim(key, limits.guaranteed, limits.limit, limits.weight, float(demand))

    def within_guarantee(self, workload: Workload) -> bool:
        """Return whether placing the workload keeps its tenant and project within their guarantees."""
        gpus = workload.total_gpus
        tenant, project = tenant_key(workload), project_key(workload)
        if self.project_usage[project] + gpus > self.project_quota(project).guaranteed:
            return False
        guaranteed = self.tenant_quota(tenant).guaranteed
        # What sibling projects hold above their own guarantees is borrowed inside the tenant and can be
        # reclaimed for this one, so it does not count against the tenant's guarantee here.
        return self.tenant_usage[tenant] + gpus <= guaranteed or self._guaranteed_usage(tenant) + gpus <= guaranteed

    def _guaranteed_usage(self, tenant: TenantKey) -> int:
        """Return the GPUs the tenant's projects hold within their own guarantees in the pool."""
        return sum(
            min(usage, int(self.project_quota(key).guaranteed))
            for key, usage in self.project_usage.items()
            if key[:2] == tenant
        )

    def charge(self, workload: Workload, sign: int) -> None:
        """Add (sign 1) or remove (sign -1) a workload's GPUs to its owners' usage."""
        self.tenant_usage[tenant_key(workload)] += sign * workload.total_gpus
        self.project_usage[project_key(workload)] += sign * workload.total_gpus

    def record_placement(self, workload: Workload, takes: list[Take]) -> None:
        """Record a placement decision and charge it to its owners."""
        capacity = self.capacity[workload.pool]
        self.placements[workload.id] = tuple(
            ReplicaAllocation(capacity.nodes[take.node].name, tuple(uuid for _, uuid in take.gpus)) for take in takes
        )
        self.charge(workload, 1)
        key = project_key(workload)
        self.placed_priority[key] = max(self.placed_priority.get(key, workload.priority), workload.priority)
