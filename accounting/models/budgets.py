"""Budgets: how many GPU-hours or how much money a tenant or one of its projects may use per period."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from accounting.choices import BudgetPeriod, BudgetUnit, HardAction, NoticeLevel
from tenants.scoping import TenantOwnedModel

MAX_AMOUNT = 10**10  # far above any plan: a larger number is a typo


class Budget(TenantOwnedModel):
    """A cap on what an owner uses per period: the tenant as a whole (`project` empty) or one project.

    Operators set a tenant's own budget; tenant admins set their projects'.
    `amount` is GPU-hours or money (`unit`); the period is each UTC month, or
    the fixed window [window_start, window_end). At `soft_percent` of the
    amount people are notified; at 100 % `hard_action` applies (each action
    includes the ones before it). `notified_period_start` and
    `notified_level` record the highest threshold already announced and in
    which period, so each is announced once per period (a compare-and-swap
    on these two columns claims the announcement).
    """

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="budgets")
    project = models.ForeignKey(
        "tenants.Project", on_delete=models.CASCADE, null=True, blank=True, related_name="budgets"
    )
    unit = models.CharField(max_length=16, choices=BudgetUnit.choices)
    amount = models.DecimalField(
        max_digits=16, decimal_places=4, validators=[MinValueValidator(0), MaxValueValidator(MAX_AMOUNT)]
    )
    period = models.CharField(max_length=16, choices=BudgetPeriod.choices, default=BudgetPeriod.MONTHLY)
    window_start = models.DateTimeField(null=True, blank=True)
    window_end = models.DateTimeField(null=True, blank=True)
    soft_percent = models.PositiveSmallIntegerField(
        default=80, validators=[MinValueValidator(1), MaxValueValidator(100)]
    )
    hard_action = models.CharField(max_length=16, choices=HardAction.choices, default=HardAction.NOTIFY_ONLY)
    notified_period_start = models.DateTimeField(null=True, blank=True)
    notified_level = models.PositiveSmallIntegerField(choices=NoticeLevel.choices, default=NoticeLevel.NONE)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant_id", "project_id", "unit"]
        constraints = [
            # One budget per owner and unit; a tenant-wide budget's NULL project would be distinct to a plain unique.
            models.UniqueConstraint(
                fields=["project", "unit"], condition=Q(project__isnull=False), name="budget_once_per_project_unit"
            ),
            models.UniqueConstraint(
                fields=["tenant", "unit"], condition=Q(project__isnull=True), name="budget_once_per_tenant_unit"
            ),
            models.CheckConstraint(condition=Q(unit__in=BudgetUnit.values), name="budget_unit_valid"),
            models.CheckConstraint(condition=Q(period__in=BudgetPeriod.values), name="budget_period_valid"),
            models.CheckConstraint(condition=Q(hard_action__in=HardAction.values), name="budget_hard_action_valid"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="budget_amount_positive"),
            models.CheckConstraint(
                condition=Q(soft_percent__gte=1, soft_percent__lte=100), name="budget_soft_percent_range"
            ),
            models.CheckConstraint(condition=Q(notified_level__in=NoticeLevel.values), name="budget_notice_valid"),
            # A window has both ends, in order; a monthly budget has none.
            models.CheckConstraint(
                condition=(
                    Q(period=BudgetPeriod.WINDOW, window_start__isnull=False, window_end__gt=F("window_start"))
                    | Q(period=BudgetPeriod.MONTHLY, window_start__isnull=True, window_end__isnull=True)
                ),
                name="budget_window_matches_period",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.audit_label()}: {self.amount} {self.unit}"

    def audit_label(self) -> str:
        """How the audit log and pages name the budget: its owner and unit."""
        owner = f"project {self.project.slug}" if self.project is not None else f"tenant {self.tenant.slug}"
        return f"{owner} ({BudgetUnit(self.unit).label})"
