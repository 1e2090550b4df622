"""Budgets: set them (operators a tenant's own, tenant admins their projects'), each change audited.

A budget caps what an owner uses per period, in GPU-hours or in money (the
usage report's cost); what each has used is read in `accounting.selectors.budgets`.

The rules of a budget, each reported on its field, all at once:
- `unit` gpu_hours or money; one budget per owner and unit;
- `amount` above 0, at most MAX_AMOUNT, at most 4 decimals;
- `period` monthly (UTC months) or window, which needs `window_start` and
  `window_end`, in order; a monthly budget has neither;
- `soft_percent` from 1 to 100 (default 80);
- `hard_action` notify_only, refuse_new, stop_borrowing or stop_running.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from accounting.choices import BudgetPeriod, BudgetUnit, HardAction
from accounting.models import Budget
from accounting.models.budgets import MAX_AMOUNT
from common.errors import FieldErrors, add_errors, invalid, raise_errors
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Project, Tenant
from tenants.scoping import tenant_id_scope, tenant_scope
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
    """Return whether `project` (one of `tenant`'s), or `tenant` itself for None, has a budget in `unit`."""
    owner = Q(project=project) if project is not None else Q(project__isnull=True)
    with tenant_scope(tenant):
        return Budget.objects.filter(owner, unit=unit).exists()


def _locked(budget: Budget) -> Budget:
    """Return `budget` reloaded under its tenant's scope and locked, with its tenant and project."""
    with tenant_id_scope(budget.tenant_id):
        return Budget.objects.select_for_update(of=("self",)).select_related("tenant", "project").get(pk=budget.pk)


@transaction.atomic
def update_budget(*, actor: Actor, budget: Budget, changes: Mapping[str, Any]) -> Budget:
    """Change a budget's amount, period, window, soft threshold or hard action; return it.

    Who may: as `create_budget`. Its owner and unit never change (`read_only`).
    Raises as `create_budget` does, naming every failing field at once.
    """
    locked = _locked(budget)
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
    locked = _locked(budget)
    require_budget_setter(actor, locked.tenant, locked.project)
    delete_audited(actor=actor, action="budget.delete", obj=locked, tenant_id=locked.tenant_id, audited=budget_snapshot)
