"""Budget notices: each budget's soft threshold and cap are announced once per period, when first reached.

The periodic task `accounting.announce_budget_thresholds` runs
`announce_budget_thresholds`: for every budget in force it compares the
highest threshold reached (`BudgetState.level`) with the one recorded on the
budget for the current period, and claims a higher one with a
compare-and-swap on (`notified_period_start`, `notified_level`), so that two
workers never announce the same crossing. A budget whose use falls back
below a recorded threshold (its amount was raised) has its record lowered:
crossing it again is announced again. Reaching the cap straight from below
the soft threshold is one notice, the cap's.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction

from accounting.choices import NoticeLevel
from accounting.models import Budget
from accounting.selectors.budgets import BudgetState, budget_states
from notifications.services import notify_budget_exhausted, notify_budget_threshold
from tenants.scoping import tenant_id_scope


def recorded_level(state: BudgetState) -> NoticeLevel:
    """Return the threshold already announced in the budget's current period (NONE in a new period)."""
    budget = state.budget
    if budget.notified_period_start != state.period.start:
        return NoticeLevel.NONE
    return NoticeLevel(budget.notified_level)


def announce_budget_thresholds(*, now: datetime) -> int:
    """Announce every threshold reached for the first time in its budget's period; return how many were.

    A few queries for all budgets (`accounting.selectors.budgets.budget_states`), and
    one update per budget whose threshold moved; each announcement is
    written in the transaction that claims it, and sent once that commits.
    """
    announced = 0
    for state in budget_states(now=now):
        level, recorded = state.level, recorded_level(state)
        if level == recorded or (level < recorded and not state.in_force):
            continue
        with transaction.atomic():
            if _claim(state, level) and level > recorded:
                tell_threshold(state, level)
                announced += 1
    return announced


def _claim(state: BudgetState, level: NoticeLevel) -> bool:
    """Record `level` as announced in the budget's current period unless another worker changed it first."""
    budget = state.budget
    with tenant_id_scope(budget.tenant_id):
        claimed = Budget.objects.filter(
            pk=budget.pk, notified_period_start=budget.notified_period_start, notified_level=budget.notified_level
        ).update(notified_period_start=state.period.start, notified_level=level)
    return claimed == 1


def tell_threshold(state: BudgetState, level: NoticeLevel) -> None:
    """Tell the tenant's admins (and its subscribed webhooks) that the budget reached its soft threshold or cap."""
    budget = state.budget
    facts: dict[str, Any] = {
        "tenant": budget.tenant,
        "budget_id": budget.pk,
        "label": budget.audit_label(),
        "unit": state.unit_label,
        "used": state.used.quantize(Decimal("0.01")),
        "amount": state.amount,
        "period_start": state.period.start,
        "period_end": state.period.end,
    }
    if level == NoticeLevel.CAP:
        notify_budget_exhausted(**facts)
    else:
        notify_budget_threshold(**facts, percent=budget.soft_percent)
