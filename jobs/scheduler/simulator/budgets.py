"""Budgets in the simulator: a GPU-hour budget per tenant over the whole trace, and what it held back.

A tenant's use is the GPU-seconds its jobs held: every finished or
preempted attempt, plus what runs now. Before each pass the budgets go into
the snapshot as the core's `BudgetState`s, so the core enforces them as it
does in production (`jobs.scheduler.core.budgets`): `stop_borrowing` holds
the tenant to its guarantee, `stop_running` stops its running work and
starts nothing more; with `refuse_new` (and every action above it) a job
arriving after the budget is used up is refused, as a submission would be.
So that a cap is enforced when it is reached, not at the next arrival or
completion, the engine is given the moment each tenant's running work will
use up its budget (`crossings`) and runs a pass then.

What the budgets held back (`summary`): the GPU-hours of pending work that
waited for reason BUDGET (GPUs waiting x time), the jobs that ever did, the
jobs refused at arrival, the preemptions with reason BUDGET, and per tenant
its budget and what it used.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jobs.scheduler.core import BudgetAction, BudgetState, Decisions, Reason, Workload
from jobs.scheduler.core.budgets import includes


@dataclass(frozen=True, slots=True)
class TenantBudget:
    """A tenant's budget of `gpu_hours` over the whole trace, and what happens once it is used up."""

    tenant: str
    gpu_hours: float
    action: BudgetAction = BudgetAction.STOP_BORROWING


def parse_budget(text: str) -> TenantBudget:
    """Return the budget `TENANT=GPU_HOURS[:ACTION]` names; raises ValueError naming what is wrong."""
    tenant, _, spec = text.partition("=")
    hours, _, action = spec.partition(":")
    try:
        amount = float(hours)
        chosen = BudgetAction(action or BudgetAction.STOP_BORROWING)
    except ValueError:
        raise ValueError(
            f"--budget {text!r}: expected TENANT=GPU_HOURS[:ACTION], ACTION one of "
            f"{', '.join(a.value for a in BudgetAction)}"
        ) from None
    if not tenant or amount <= 0:
        raise ValueError(f"--budget {text!r}: a tenant and a positive number of GPU-hours")
    return TenantBudget(tenant, amount, chosen)


class BudgetBooks:
    """The simulator's books of what each budgeted tenant used, and of what its budget held back."""

    def __init__(self, budgets: Iterable[TenantBudget]) -> None:
        self.budgets = {b.tenant: b for b in budgets}
        self.spent_s: dict[str, float] = defaultdict(float)
        self.held_gpu_s = 0.0
        self.held_jobs: set[str] = set()
        self.refused: list[str] = []
        self.stopped = 0
        self._held_now = 0
        self._since = 0.0
        self._crossing: dict[str, float] = {}

    def used_s(self, tenant: str, running: Iterable[Workload], now: float) -> float:
        """Return the GPU-seconds `tenant` used until `now`, what runs now included."""
        live = sum(
            w.total_gpus * (now - w.started_at) for w in running if w.tenant == tenant and w.started_at is not None
        )
        return self.spent_s[tenant] + live

    def charge(self, workload: Workload, now: float) -> None:
        """Book the GPU-seconds of an attempt that ends (finishes or is preempted) at `now`."""
        if workload.tenant in self.budgets and workload.started_at is not None:
            self.spent_s[workload.tenant] += workload.total_gpus * (now - workload.started_at)

    def states(self, running: Iterable[Workload], now: float) -> tuple[BudgetState, ...]:
        """Return the budgets as the core reads them, with what each tenant used until `now`."""
        running = list(running)
        return tuple(
            BudgetState(t, None, b.action, self.used_s(t, running, now) / 3600, b.gpu_hours, period="in the trace")
            for t, b in sorted(self.budgets.items())
        )

    def refuses(self, tenant: str, running: Iterable[Workload], now: float) -> bool:
        """Return whether a job of `tenant` arriving at `now` is refused: its budget is used up and refuses it."""
        budget = self.budgets.get(tenant)
        if budget is None or not includes(budget.action, BudgetAction.REFUSE_NEW):
            return False
        return self.used_s(tenant, running, now) >= budget.gpu_hours * 3600

    def must_pass(self, running: Iterable[Workload], now: float) -> bool:
        """Return whether running work has to be looked at even with nothing pending: a budget stops it."""
        running = list(running)
        return any(
            b.action is BudgetAction.STOP_RUNNING
            and any(w.tenant == t for w in running)
            and self.used_s(t, running, now) >= b.gpu_hours * 3600
            for t, b in self.budgets.items()
        )

    def observe(self, now: float, decisions: Decisions, pending: Mapping[str, Workload]) -> None:
        """Book what the pass at `now` held back: the GPUs left waiting for BUDGET from now until the next pass."""
        self.held_gpu_s += self._held_now * (now - self._since)
        held = [w for w, why in decisions.waiting.items() if why.reason is Reason.BUDGET and w in pending]
        self.held_jobs.update(held)
        self._held_now = sum(pending[w].total_gpus for w in held)
        self._since = now
        self.stopped += sum(1 for p in decisions.preemptions if p.reason is Reason.BUDGET)

    def crossings(self, running: Iterable[Workload], now: float) -> list[tuple[float, str]]:
        """Return (when, tenant) for each tenant whose running work will use up its budget at a moment not
        already announced: the engine runs a pass then."""
        running = list(running)
        found = []
        for tenant, budget in sorted(self.budgets.items()):
            gpus = sum(w.total_gpus for w in running if w.tenant == tenant)
            left = budget.gpu_hours * 3600 - self.used_s(tenant, running, now)
            if gpus and left > 0:
                when = now + left / gpus
                if self._crossing.get(tenant) != when:
                    self._crossing[tenant] = when
                    found.append((when, tenant))
        return found

    def summary(self, running: Iterable[Workload], now: float) -> dict[str, Any]:
        """Return what the budgets held back, and per tenant its budget and what it used."""
        running = list(running)
        held = self.held_gpu_s + self._held_now * (now - self._since)
        return {
            "held_back_gpu_hours": round(held / 3600, 1),
            "jobs_held": len(self.held_jobs),
            "jobs_refused": len(self.refused),
            "budget_preemptions": self.stopped,
            "tenants": {
                t: {
                    "budget_gpu_hours": b.gpu_hours,
                    "action": b.action.value,
                    "used_gpu_hours": round(self.used_s(t, running, now) / 3600, 1),
                }
                for t, b in sorted(self.budgets.items())
            },
        }
