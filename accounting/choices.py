"""Accounting's enumerations: priced resources, report dimensions, and budgets' and requests' own.

Budgets: units, periods, hard actions and notice levels; requests for more:
kinds and states, the states with their transition table.
"""

from __future__ import annotations

from django.db import models

from common.transitions import Transitions


class Resource(models.TextChoices):
    """What a price is for: one GPU for an hour, one CPU core for an hour, or one GiB of memory for an hour."""

    GPU = "gpu", "GPU-hour"
    CPU = "cpu", "CPU-hour"
    MEMORY = "memory", "GiB-hour of memory"


class Dimension(models.TextChoices):
    """What a usage report's rows are grouped by. Tenant admins may group by all but `tenant`."""

    TENANT = "tenant", "Tenant"
    PROJECT = "project", "Project"
    USER = "user", "User"
    POOL = "pool", "Pool"
    GPU_MODEL = "gpu_model", "GPU model"
    WORKLOAD = "workload", "Workload"


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


REQUEST_TRANSITIONS: Transitions[RequestState] = Transitions(
    "increase request",
    RequestState,
    {
        # A pending request whose end date passes expires undecided: there is nothing left to approve.
        RequestState.PENDING: frozenset(
            {RequestState.APPROVED, RequestState.REFUSED, RequestState.CANCELLED, RequestState.EXPIRED}
        ),
        RequestState.APPROVED: frozenset({RequestState.EXPIRED}),
        RequestState.REFUSED: frozenset(),
        RequestState.EXPIRED: frozenset(),
        RequestState.CANCELLED: frozenset(),
    },
)
