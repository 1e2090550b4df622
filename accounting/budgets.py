"""Budgets: set them (operators a tenant's own, tenant admins their projects'), and read what each has used.

A budget caps what an owner uses per period, in GPU-hours or in money (the
usage report's cost). What it has used is a usage report's own figure
(`accounting.selectors`: one rule in one place), read for every budget at
once: one query for the budgets, then one report per period in use (all
monthly budgets share one; one tenant's report when only one tenant has
budgets in it, the platform's, grouped by tenant and project, otherwise),
which reads settled hours from the hourly rollups and only the rest from
the ledger. No budget, one query: cheap enough for every scheduling pass
(`jobs.scheduler.snapshot`) and every submission
(`jobs.services.quota_rules.check_budget`).

The rules of a budget, each reported on its field, all at once:
- `unit` gpu_hours or money; one budget per owner and unit;
- `amount` above 0, at most MAX_AMOUNT, at most 4 decimals;
- `period` monthly (UTC months) or window, which needs `window_start` and
  `window_end`, in order; a monthly budget has neither;
- `soft_percent` from 1 to 100 (default 80);
- `hard_action` notify_only, refuse_new, stop_borrowing or stop_running.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet

from accounting import selectors
from accounting.budget_choices import BudgetPeriod, BudgetUnit, HardAction, NoticeLevel
from accounting.choices import Dimension
from accounting.models import Budget
from accounting.models.budgets import MAX_AMOUNT
from accounting.periods import Period, month_start, next_month
from common.errors import FieldErrors, add_errors, invalid, raise_errors
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Project, Tenant
from tenants.services.access import require_operator, require_role
from tenants.services.audit import JsonDict, delete_audited, record_audit_event, update_audited

UPDATABLE = ("amount", "period", "window_start", "window_end", "soft_percent", "hard_action")
_HOUR = Decimal(3600)
_MICRO = Decimal("0.000001")


# --- the rules -----------------------------------------------------------------------------------------------


def budget_errors(values: Mapping[str, Any]) -> FieldErrors:
    """Return the rules the budget fields given in `values` break on their own, by field (empty: none).

    A field left out is not judged; `window_start` and `window_end` are
    judged against `period` when it is given.
    """
    errors: FieldErrors = {}
    if "unit" in values and values["unit"] not in BudgetUnit.values:
        add_errors(errors, invalid("unit", "invalid_choice", f"Choose one of {', '.join(BudgetUnit.values)}."))
    if "amount" in values and _amount(values["amount"]) is None:
        message = f"Give an amount above 0 and at most {MAX_AMOUNT}, with at most 4 decimals."
        add_errors(errors, invalid("amount", "invalid_amount", message))
    if "soft_percent" in values:
        percent = values["soft_percent"]
        if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
            add_errors(errors, invalid("soft_percent", "out_of_range", "Give a whole percentage from 1 to 100."))
    if "hard_action" in values and values["hard_action"] not in HardAction.values:
        choices = ", ".join(HardAction.values)
        add_errors(errors, invalid("hard_action", "invalid_choice", f"Choose one of {choices}."))
    if "period" in values:
        _period_errors(values, errors)
    return errors


def _amount(value: object) -> Decimal | None:
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None
    if not amount.is_finite() or amount <= 0 or amount > MAX_AMOUNT or amount != amount.quantize(Decimal("0.0001")):
        return None
    return amount


def _period_errors(values: Mapping[str, Any], errors: FieldErrors) -> None:
    period, start, end = values["period"], values.get("window_start"), values.get("window_end")
    if period == BudgetPeriod.MONTHLY:
        for name, moment in (("window_start", start), ("window_end", end)):
            if moment is not None:
                add_errors(errors, invalid(name, "window_only", "Only a fixed-window budget has a window."))
    elif period == BudgetPeriod.WINDOW:
        for name, moment in (("window_start", start), ("window_end", end)):
            if moment is None:
                add_errors(errors, invalid(name, "required", "A fixed-window budget needs a start and an end."))
        if start is not None and end is not None and end <= start:
            add_errors(errors, invalid("window_end", "end_before_start", "The end must come after the start."))
    else:
        add_errors(errors, invalid("period", "invalid_choice", f"Choose one of {', '.join(BudgetPeriod.values)}."))


# --- who sets what -------------------------------------------------------------------------------------------


def require_budget_setter(actor: Actor, tenant: Tenant, project: Project | None) -> None:
    """Raise unless `actor` may set this budget: operators the tenant's own, tenant admins (and operators) a
    project's. Http404 when it cannot see the tenant, PermissionDenied when its role is too low."""
    if project is None:
        require_role(actor, tenant, Role.VIEWER)
        require_operator(actor)
    else:
        require_role(actor, tenant, Role.ADMIN)


def budget_snapshot(budget: Budget) -> JsonDict:
    """Return how the audit log records a budget."""
    # Names, not ids: the audit log shows these as they were when the change was made.
    return {
        "project": budget.project.slug if budget.project is not None else None,
        "unit": budget.unit,
        "amount": str(budget.amount),
        "period": budget.period,
        "window_start": budget.window_start.isoformat() if budget.window_start else None,
        "window_end": budget.window_end.isoformat() if budget.window_end else None,
        "soft_percent": budget.soft_percent,
        "hard_action": budget.hard_action,
    }


# --- services ------------------------------------------------------------------------------------------------


@transaction.atomic
def create_budget(
    *,
    actor: Actor,
    tenant: Tenant,
    project: Project | None = None,
    unit: str = BudgetUnit.GPU_HOURS,
    amount: Decimal | str | int,
    period: str = BudgetPeriod.MONTHLY,
    window_start: datetime | None = None,
    window_end: datetime | None = None,
    soft_percent: int = 80,
    hard_action: str = HardAction.NOTIFY_ONLY,
) -> Budget:
    """Give `tenant` (with `project`: that project) a budget and return it.

    Operators set a tenant's own budget, tenant admins a project's. Raises
    Http404, PermissionDenied, or ValidationError naming every failing field
    at once (rules of the module docstring; `project`: `not_found` for a
    project of another tenant; `unit`: `unique` when the owner already has
    a budget in that unit), nothing written.
    """
    require_budget_setter(actor, tenant, project)
    values = {
        "unit": unit,
        "amount": amount,
        "period": period,
        "window_start": window_start,
        "window_end": window_end,
        "soft_percent": soft_percent,
        "hard_action": hard_action,
    }
    errors = budget_errors(values)
    if project is not None and project.tenant_id != tenant.pk:
        add_errors(errors, invalid("project", "not_found", "No such project in this tenant."))
    elif "unit" not in errors and _owner_has(tenant, project, unit):
        add_errors(errors, invalid("unit", "unique", "This owner already has a budget in that unit; change that one."))
    raise_errors(errors)
    budget = Budget(tenant=tenant, project=project, created_by=actor.user, **{**values, "amount": _amount(amount)})
    try:
        with transaction.atomic():  # a savepoint: a concurrent twin's insert fails without spoiling the caller's
            budget.save()
    except IntegrityError:
        raise invalid("unit", "unique", "This owner already has a budget in that unit; change that one.") from None
    record_audit_event(
        actor=actor, action="budget.create", obj=budget, tenant_id=tenant.pk, after=budget_snapshot(budget)
    )
    return budget


def _owner_has(tenant: Tenant, project: Project | None, unit: str) -> bool:
    owner = Q(project=project) if project is not None else Q(tenant=tenant, project__isnull=True)
    return Budget.all_tenants.filter(owner, unit=unit).exists()


@transaction.atomic
def update_budget(*, actor: Actor, budget: Budget, changes: Mapping[str, Any]) -> Budget:
    """Change a budget's amount, period, window, soft threshold or hard action; return it.

    Who may: as `create_budget`. Its owner and unit never change (`read_only`).
    Raises as `create_budget` does, naming every failing field at once.
    """
    locked = Budget.all_tenants.select_for_update(of=("self",)).select_related("tenant", "project").get(pk=budget.pk)
    require_budget_setter(actor, locked.tenant, locked.project)
    errors: FieldErrors = {}
    for name in changes:
        if name not in UPDATABLE:
            add_errors(errors, invalid(name, "read_only", "A budget's owner and unit stay as created."))
    merged = {name: getattr(locked, name) for name in UPDATABLE}
    merged.update({name: value for name, value in changes.items() if name in UPDATABLE})
    if merged["period"] == BudgetPeriod.MONTHLY and "period" in changes:
        # Switching to monthly drops the window unless the caller gave one (which is then an error).
        merged["window_start"] = changes.get("window_start")
        merged["window_end"] = changes.get("window_end")
    found = budget_errors(merged)
    for name, messages in found.items():
        errors.setdefault(name, []).extend(messages)
    raise_errors(errors)
    merged["amount"] = _amount(merged["amount"])
    return update_audited(
        actor=actor,
        action="budget.update",
        obj=locked,
        changes=merged,
        tenant_id=locked.tenant_id,
        audited=budget_snapshot,
    )


@transaction.atomic
def delete_budget(*, actor: Actor, budget: Budget) -> None:
    """Remove a budget; who may: as `create_budget`. Raises Http404 or PermissionDenied."""
    locked = Budget.all_tenants.select_for_update(of=("self",)).select_related("tenant", "project").get(pk=budget.pk)
    require_budget_setter(actor, locked.tenant, locked.project)
    delete_audited(actor=actor, action="budget.delete", obj=locked, tenant_id=locked.tenant_id, audited=budget_snapshot)


# --- selectors -----------------------------------------------------------------------------------------------


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
