"""Budgets as read: which are in scope, and what each has used in its current period (`BudgetState`).

What a budget has used is a usage report's own figure (`accounting.selectors`:
one rule in one place), read for every budget at once: one query for the
budgets, then one report per period in use (all monthly budgets share one;
one tenant's report when only one tenant has budgets in it, the platform's,
grouped by tenant and project, otherwise), which reads settled hours from the
hourly rollups and only the rest from the ledger. No budget, one query: cheap
enough for every scheduling pass (`jobs.scheduler.snapshot`) and every
submission (`jobs.services.quota_rules.check_budget`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Q, QuerySet

from accounting import selectors
from accounting.choices import BudgetPeriod, BudgetUnit, Dimension, HardAction, NoticeLevel
from accounting.models import Budget
from accounting.periods import Period, month_start, next_month
from tenants.models import Project, Tenant

_HOUR = Decimal(3600)
_MICRO = Decimal("0.000001")


def budgets_in_scope() -> QuerySet[Budget]:
    """Return the active tenant's budgets, its own first, then its projects' by slug."""
    return Budget.objects.select_related("tenant", "project").order_by("project__slug", "unit")


def all_budgets() -> QuerySet[Budget]:
    """Return every tenant's budgets: operators' view, across tenants by design."""
    return Budget.all_tenants.select_related("tenant", "project").order_by("tenant__slug", "project__slug", "unit")


@dataclass(frozen=True)
class BudgetState:
    """A budget and what its owner used of it in its current period (`used`: GPU-hours or money).

    `in_force` is False for a fixed window that has not begun or has ended:
    such a budget holds nothing back.
    """

    budget: Budget
    period: Period
    used: Decimal
    in_force: bool
    currency: str

    @property
    def amount(self) -> Decimal:
        return self.budget.amount

    @property
    def remaining(self) -> Decimal:
        return max(Decimal(0), self.amount - self.used)

    @property
    def percent(self) -> float:
        """Return the share used, in percent (above 100 once over)."""
        return float(self.used / self.amount * 100) if self.amount else 0.0

    @property
    def exhausted(self) -> bool:
        return self.in_force and self.used >= self.amount

    @property
    def level(self) -> NoticeLevel:
        """Return the highest threshold reached in the period (nothing while not in force)."""
        if not self.in_force:
            return NoticeLevel.NONE
        if self.used >= self.amount:
            return NoticeLevel.CAP
        return NoticeLevel.SOFT if self.percent >= self.budget.soft_percent else NoticeLevel.NONE

    def enforces(self, action: HardAction) -> bool:
        """Return whether the budget is used up and its hard action includes `action`."""
        return self.exhausted and HardAction(self.budget.hard_action).includes(action)

    @property
    def unit_label(self) -> str:
        """Return how amounts of this budget read: "GPU-hours", or the currency."""
        return "GPU-hours" if self.budget.unit == BudgetUnit.GPU_HOURS else self.currency

    @property
    def owner_label(self) -> str:
        budget = self.budget
        return f"project {budget.project.slug}" if budget.project is not None else f"tenant {budget.tenant.slug}"

    @property
    def period_label(self) -> str:
        """Return "this month", or "from 2026-11-01 to 2026-12-01" for a window."""
        if self.budget.period == BudgetPeriod.MONTHLY:
            return "this month"
        return f"from {self.period.start:%Y-%m-%d %H:%M} to {self.period.end:%Y-%m-%d %H:%M} UTC"

    def describe(self) -> str:
        """Return one sentence: whose budget, how large, for when, and how much is used."""
        return (
            f"The budget of {self.owner_label} ({self.amount.normalize():f} {self.unit_label} {self.period_label}) "
            f"has {self.used.quantize(Decimal('0.01'))} used ({self.percent:.0f} %)"
        )


def budget_period(budget: Budget, now: datetime) -> Period:
    """Return the budget's current period: the UTC month of `now`, or its fixed window."""
    if budget.period == BudgetPeriod.MONTHLY:
        start = month_start(now)
        return Period("this-month", start, next_month(start))
    assert budget.window_start is not None and budget.window_end is not None  # a database constraint
    return Period("window", budget.window_start, budget.window_end)


def budget_states(
    *,
    now: datetime,
    tenant_ids: Collection[int] | None = None,
    project_ids: Collection[int] | None = None,
    actions: Collection[str] | None = None,
) -> list[BudgetState]:
    """Return every budget's state at `now`, tenants' own first, in a few grouped queries (module docstring).

    Narrowed to the budgets of `tenant_ids`, to tenants' own budgets and
    those of `project_ids` when given, and to hard actions in `actions`.
    """
    rows = Budget.all_tenants.select_related("tenant", "project").order_by("tenant_id", "project_id", "unit")
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=sorted(tenant_ids))
    if project_ids is not None:
        rows = rows.filter(Q(project__isnull=True) | Q(project_id__in=sorted(project_ids)))
    if actions is not None:
        rows = rows.filter(hard_action__in=sorted(actions))
    budgets = list(rows)
    if not budgets:
        return []
    by_period: dict[Period, list[Budget]] = defaultdict(list)
    for budget in budgets:
        by_period[budget_period(budget, now)].append(budget)
    states: list[BudgetState] = []
    for period, group in by_period.items():
        used, currency = _usage_by_owner({b.tenant for b in group}, period, now)
        for budget in group:
            in_force = period.start <= now < period.end
            states.append(BudgetState(budget, period, _used(budget, used), in_force, currency))
    return states


def _usage_by_owner(
    tenants: set[Tenant], period: Period, now: datetime
) -> tuple[dict[tuple[str, str], selectors.Usage], str]:
    """Return what each (tenant slug, project slug) used in `period` until `now`, priced, and the currency.

    A usage report's own numbers: one tenant's report for one tenant, the
    platform's (every tenant, in the same few queries) for more.
    """
    if len(tenants) == 1:
        (tenant,) = tenants
        report = selectors.tenant_report(tenant, period, [Dimension.PROJECT.value], now=now)
        return {(tenant.slug, row.key[0]): row.usage for row in report.rows}, report.currency
    report = selectors.platform_report(period, [Dimension.TENANT.value, Dimension.PROJECT.value], now=now)
    return {(row.key[0], row.key[1]): row.usage for row in report.rows}, report.currency


def _used(budget: Budget, usage: Mapping[tuple[str, str], selectors.Usage]) -> Decimal:
    tenant, project = budget.tenant.slug, _slug(budget.project)
    # A tenant's own budget counts all its projects; a project's, its own use.
    parts = [found for (owner, of), found in usage.items() if owner == tenant and (not project or of == project)]
    if budget.unit == BudgetUnit.MONEY:
        return sum((part.cost for part in parts), Decimal(0)).quantize(_MICRO)
    seconds = sum(part.gpu_seconds for part in parts)
    return (Decimal(repr(seconds)) / _HOUR).quantize(_MICRO)


def tenant_budget_states(tenant: Tenant, *, now: datetime) -> list[BudgetState]:
    """Return the states of `tenant`'s budgets: its own first, then its projects' by slug."""
    states = budget_states(now=now, tenant_ids=[tenant.pk])
    return sorted(states, key=lambda s: (s.budget.project is not None, _slug(s.budget.project), s.budget.unit))


def _slug(project: Project | None) -> str:
    return project.slug if project is not None else ""


def budgets_holding(projects: Collection[Project], action: HardAction, *, now: datetime) -> dict[int, BudgetState]:
    """Return, by project id, the used-up budget (the project's own, else its tenant's) whose hard action
    includes `action`, for each of `projects` that has one. A few queries for any number of projects."""
    if not projects:
        return {}
    actions = [a.value for a in HardAction if HardAction(a).includes(action)]
    states = budget_states(
        now=now, tenant_ids={p.tenant_id for p in projects}, project_ids={p.pk for p in projects}, actions=actions
    )
    found: dict[int, BudgetState] = {}
    for project in projects:
        for state in states:
            applies = state.budget.project_id == project.pk or (
                state.budget.project_id is None and state.budget.tenant_id == project.tenant_id
            )
            if applies and state.enforces(action):
                found.setdefault(project.pk, state)
    return found


def states_for_project(project: Project, *, now: datetime) -> list[BudgetState]:
    """Return the states of the budgets `project` answers to in force now: its own, then its tenant's."""
    states = budget_states(now=now, tenant_ids=[project.tenant_id], project_ids=[project.pk])
    return sorted((s for s in states if s.in_force), key=lambda s: (s.budget.project_id is None, s.budget.unit))
