"""The shapes of budgets (with what is used of them) and of requests for more in the API."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from rest_framework import serializers

from accounting.choices import BudgetPeriod, BudgetUnit, HardAction, RequestKind
from accounting.models import Budget, IncreaseRequest
from accounting.selectors.budgets import BudgetState
from common.api.fields import Integer
from tenants.api.fields import ScopedSlugField
from tenants.models import MAX_GPUS
from tenants.selectors import projects_in_scope, tenants_visible_to

_CENTI = Decimal("0.01")
BUDGET_FIELDS = ["unit", "amount", "period", "window_start", "window_end", "soft_percent", "hard_action"]


def _projects(context: dict[str, Any]) -> Any:
    return projects_in_scope()


def _tenants(context: dict[str, Any]) -> Any:
    return tenants_visible_to(context["actor"])


class BudgetSerializer(serializers.ModelSerializer):
    """A budget and its current period: `used` and `remaining` in its unit (GPU-hours, or money in `currency`),
    `percent` used, and whether it is `in_force` now (a fixed window may not be). `project` is null for the
    tenant's own budget, which operators set."""

    tenant: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    used = serializers.SerializerMethodField()
    remaining = serializers.SerializerMethodField()
    percent = serializers.SerializerMethodField()
    in_force = serializers.SerializerMethodField()
    period_start = serializers.SerializerMethodField()
    period_end = serializers.SerializerMethodField()
    currency = serializers.SerializerMethodField()

    class Meta:
        model = Budget
        fields = [
            "id",
            "tenant",
            "project",
            *BUDGET_FIELDS,
            "used",
            "remaining",
            "percent",
            "in_force",
            "period_start",
            "period_end",
            "currency",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def _state(self, budget: Budget) -> BudgetState:
        states: dict[int, BudgetState] = self.context["states"]  # built by the view for its page
        return states[budget.pk]

    def get_used(self, budget: Budget) -> str:
        return str(self._state(budget).used.quantize(_CENTI))

    def get_remaining(self, budget: Budget) -> str:
        return str(self._state(budget).remaining.quantize(_CENTI))

    def get_percent(self, budget: Budget) -> float:
        return round(self._state(budget).percent, 1)

    def get_in_force(self, budget: Budget) -> bool:
        return self._state(budget).in_force

    def get_period_start(self, budget: Budget) -> str:
        return self._state(budget).period.start.isoformat()

    def get_period_end(self, budget: Budget) -> str:
        return self._state(budget).period.end.isoformat()

    def get_currency(self, budget: Budget) -> str:
        return self._state(budget).currency


class BudgetValuesSerializer(serializers.Serializer):
    """A budget's numbers; the service judges them (all failing fields at once)."""

    amount = serializers.DecimalField(max_digits=16, decimal_places=4, min_value=0)
    period = serializers.ChoiceField(choices=BudgetPeriod.choices, default=BudgetPeriod.MONTHLY)
    window_start = serializers.DateTimeField(required=False, allow_null=True, default=None)
    window_end = serializers.DateTimeField(required=False, allow_null=True, default=None)
    soft_percent = Integer(required=False, default=80, min_value=1, max_value=100)
    hard_action = serializers.ChoiceField(choices=HardAction.choices, default=HardAction.NOTIFY_ONLY)


class BudgetCreateSerializer(BudgetValuesSerializer):
    """A project's budget (tenant admins): the project by slug, the unit, the numbers."""

    project = ScopedSlugField(selector=_projects)
    unit = serializers.ChoiceField(choices=BudgetUnit.choices, default=BudgetUnit.GPU_HOURS)


class PlatformBudgetCreateSerializer(BudgetValuesSerializer):
    """A tenant's own budget (operators): the tenant by slug, the unit, the numbers."""

    tenant = ScopedSlugField(selector=_tenants)
    unit = serializers.ChoiceField(choices=BudgetUnit.choices, default=BudgetUnit.GPU_HOURS)


class BudgetUpdateSerializer(serializers.Serializer):
    """The numbers of a budget to change; its owner and unit stay."""

    amount = serializers.DecimalField(max_digits=16, decimal_places=4, min_value=0, required=False)
    period = serializers.ChoiceField(choices=BudgetPeriod.choices, required=False)
    window_start = serializers.DateTimeField(required=False, allow_null=True)
    window_end = serializers.DateTimeField(required=False, allow_null=True)
    soft_percent = Integer(required=False, min_value=1, max_value=100)
    hard_action = serializers.ChoiceField(choices=HardAction.choices, required=False)


class IncreaseRequestSerializer(serializers.ModelSerializer):
    """A request for more: quota (`pool`, `asked_guaranteed`, `asked_limit` GPUs) or budget (`unit`,
    `asked_extra`), until `ends_at`. Once approved, `previous` is what was in force and `granted` what the
    approval set; expiry at `ends_at` takes it back."""

    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    pool: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    unit = serializers.CharField(source="budget.unit", read_only=True, allow_null=True, default=None)
    requester = serializers.CharField(source="requester.username", read_only=True, allow_null=True, default=None)
    decided_by = serializers.CharField(source="decided_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = IncreaseRequest
        fields = [
            "id",
            "project",
            "kind",
            "pool",
            "asked_guaranteed",
            "asked_limit",
            "unit",
            "asked_extra",
            "reason",
            "ends_at",
            "state",
            "requester",
            "decided_by",
            "decided_at",
            "decision_note",
            "previous",
            "granted",
            "expiry_problem",
            "expired_at",
            "created_at",
        ]
        read_only_fields = fields


class IncreaseRequestCreateSerializer(serializers.Serializer):
    """A request for more: for a `project` (by slug; left out: the tenant's own), of `kind` quota (`pool`,
    `guaranteed`, `limit`) or budget (`unit`, `extra`), with a `reason` and an `ends_at` in the future."""

    kind = serializers.ChoiceField(choices=RequestKind.choices)
    project = ScopedSlugField(selector=_projects, required=False, allow_null=True, default=None)
    pool = serializers.CharField(required=False, allow_blank=True, default="", max_length=100)
    guaranteed = Integer(required=False, allow_null=True, default=None, min_value=0, max_value=MAX_GPUS)
    limit = Integer(required=False, allow_null=True, default=None, min_value=0, max_value=MAX_GPUS)
    unit = serializers.ChoiceField(choices=BudgetUnit.choices, required=False, allow_blank=True, default="")
    extra = serializers.DecimalField(
        max_digits=16, decimal_places=4, min_value=0, required=False, allow_null=True, default=None
    )
    reason = serializers.CharField(max_length=2000, allow_blank=True)
    ends_at = serializers.DateTimeField()


class DecisionSerializer(serializers.Serializer):
    """A decision's optional note for the requester."""

    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
