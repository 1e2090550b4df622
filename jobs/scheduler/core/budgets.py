"""Budgets as one more rule of a pass: an owner whose budget is used up holds back its own work.

A budget belongs to a tenant (its own) or to one project. Once it is used up
(`BudgetState.exhausted`) its hard action applies:

- `stop_borrowing`: the owner may hold no more than its guarantee in each
  pool (a project's own guarantee, or its tenant's where it has no quota of
  its own); pending work beyond it waits with reason BUDGET, and what already
  runs above the guarantee keeps running;
- `stop_running`: the owner may hold nothing: its running work is preempted
  (reason BUDGET; execution stops it with its grace period) and its pending
  work waits with reason BUDGET;
- `notify_only` and `refuse_new` are not the core's: people are told, new
  submissions are refused (`jobs.services.quota_rules.check_budget`).

A workload answers to its project's budget and to its tenant's; the first
that holds it back (the project's first) names the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from jobs.scheduler.core.model import BudgetAction, BudgetState, Workload

if TYPE_CHECKING:
    from jobs.scheduler.core.state import PassState

_SEVERITY = {
    BudgetAction.NOTIFY_ONLY: 0,
    BudgetAction.REFUSE_NEW: 1,
    BudgetAction.STOP_BORROWING: 2,
    BudgetAction.STOP_RUNNING: 3,
}


def includes(action: BudgetAction, other: BudgetAction) -> bool:
    """Return whether `action` does everything `other` does."""
    return _SEVERITY[action] >= _SEVERITY[other]


class BudgetCaps:
    """The used-up budgets a pass enforces, by owner: the most severe of each owner's (a GPU-hour and a money
    budget may both be used up)."""

    def __init__(self, budgets: Iterable[BudgetState]) -> None:
        self.tenants: dict[str, BudgetState] = {}
        self.projects: dict[tuple[str, str], BudgetState] = {}
        ordered = sorted(budgets, key=lambda b: (b.tenant, b.project or "", -_SEVERITY[b.action], b.unit, b.used))
        for budget in ordered:
            if not budget.exhausted or not includes(budget.action, BudgetAction.STOP_BORROWING):
                continue
            if budget.project is None:
                self.tenants.setdefault(budget.tenant, budget)
            else:
                self.projects.setdefault((budget.tenant, budget.project), budget)

    def __bool__(self) -> bool:
        return bool(self.tenants or self.projects)

    def _applying(self, workload: Workload) -> list[BudgetState]:
        found = [self.projects.get((workload.tenant, workload.project)), self.tenants.get(workload.tenant)]
        return [budget for budget in found if budget is not None]

    def stopping(self, workload: Workload) -> BudgetState | None:
        """Return the used-up budget that stops the running `workload`, or None."""
        return next((b for b in self._applying(workload) if b.action is BudgetAction.STOP_RUNNING), None)

    def blocks(self, state: PassState, workload: Workload, pool: str) -> str | None:
        """Return why a budget holds `workload` back from starting in `pool` now, or None when none does."""
        for budget in self._applying(workload):
            if budget.project is None:
                usage = state.tenant_usage.get((pool, workload.tenant), 0)
                guarantee = state.tenant_quota((pool, workload.tenant)).guaranteed
            else:
                key = (pool, workload.tenant, workload.project)
                usage = state.project_usage.get(key, 0)
                guarantee = state.project_quota(key).guaranteed
            if budget.action is BudgetAction.STOP_RUNNING:
                return f"{used_up(budget)}: its work does not run until the budget is raised or its period ends."
            if usage + workload.total_gpus > guarantee:
                gpus = workload.total_gpus
                return (
                    f"{used_up(budget)}: it may hold no more than its guarantee of {guarantee:g} GPUs in pool "
                    f"{pool} and holds {usage}; this workload asks for {gpus} GPU{'s' if gpus != 1 else ''}."
                )
        return None


def owner_of(budget: BudgetState) -> str:
    """Return how sentences name a budget's owner: "Project alpha" or "Tenant acme"."""
    return f"Project {budget.project}" if budget.project is not None else f"Tenant {budget.tenant}"


def used_up(budget: BudgetState) -> str:
    """Return the sentence's start that names a used-up budget and what was used of it."""
    return (
        f"{owner_of(budget)}'s budget of {budget.amount:.10g} {budget.unit} {budget.period} is used up "
        f"({budget.used:.1f} used)"
    )
