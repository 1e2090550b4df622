"""Budgets' and increase requests' enumerations: units, periods, hard actions, notices, request kinds and states.

Beside `accounting/choices.py` (prices and report dimensions) so that each
concern is found by name; the request states carry their transition table.
"""

from __future__ import annotations

from django.db import models


class BudgetUnit(models.TextChoices):
    """What a budget counts: GPU-hours held, or money (the report's cost, in ACCOUNTING_CURRENCY)."""

    GPU_HOURS = "gpu_hours", "GPU-hours"
    MONEY = "money", "Money"


class BudgetPeriod(models.TextChoices):
    """When a budget's use starts again from zero: each UTC month, or never inside its fixed window."""

    MONTHLY = "monthly", "Monthly"
    WINDOW = "window", "Fixed window"


class HardAction(models.TextChoices):
    """What happens at the cap (100 %). Each action includes every one before it."""

    NOTIFY_ONLY = "notify_only", "Notify only"
    REFUSE_NEW = "refuse_new", "Refuse new submissions"
    STOP_BORROWING = "stop_borrowing", "Also stop borrowing above the guarantee"
    STOP_RUNNING = "stop_running", "Also stop running work"

    def includes(self, other: HardAction) -> bool:
        """Return whether this action does everything `other` does."""
        return _ACTION_ORDER.index(self) >= _ACTION_ORDER.index(other)


_ACTION_ORDER = [HardAction.NOTIFY_ONLY, HardAction.REFUSE_NEW, HardAction.STOP_BORROWING, HardAction.STOP_RUNNING]


class NoticeLevel(models.IntegerChoices):
    """The highest threshold already announced in a budget's period: none, the soft threshold, or the cap."""

    NONE = 0, "None"
    SOFT = 1, "Soft threshold"
    CAP = 2, "Cap"


class RequestKind(models.TextChoices):
    """What an increase request asks for: more GPU quota in a pool, or more budget."""

    QUOTA = "quota", "Quota"
    BUDGET = "budget", "Budget"


class RequestState(models.TextChoices):
    """Where an increase request stands; legal moves are in REQUEST_TRANSITIONS."""

    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REFUSED = "refused", "Refused"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"


REQUEST_TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    # A pending request whose end date passes expires undecided: there is nothing left to approve.
    RequestState.PENDING: frozenset(
        {RequestState.APPROVED, RequestState.REFUSED, RequestState.CANCELLED, RequestState.EXPIRED}
    ),
    RequestState.APPROVED: frozenset({RequestState.EXPIRED}),
    RequestState.REFUSED: frozenset(),
    RequestState.EXPIRED: frozenset(),
    RequestState.CANCELLED: frozenset(),
}


def request_can_move(current: str, target: str) -> bool:
    """Return whether a request may go from `current` to `target`."""
    return RequestState(target) in REQUEST_TRANSITIONS[RequestState(current)]
