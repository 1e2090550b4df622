"""Forms of the budgets and requests pages: input shapes only; the rules are accounting's services'."""

from __future__ import annotations

from typing import Any

from django import forms

from accounting.choices import BudgetPeriod, BudgetUnit, HardAction, RequestKind
from frontend.forms.base import _choices

# How a page names the tenant's own budget or quota in a project choice.
TENANT_ITSELF = ""


def _moment(label: str, **kwargs: Any) -> forms.DateTimeField:
    return forms.DateTimeField(
        label=label, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}), help_text="UTC.", **kwargs
    )


class BudgetNumbersForm(forms.Form):
    """A budget's amount, period and thresholds."""

    amount = forms.DecimalField(max_digits=16, decimal_places=4, help_text="GPU-hours, or money in the currency.")
    period = forms.ChoiceField(choices=BudgetPeriod.choices, initial=BudgetPeriod.MONTHLY)
    window_start = _moment("Window start", required=False)
    window_end = _moment("Window end", required=False)
    soft_percent = forms.IntegerField(initial=80, label="Notify at (%)")
    hard_action = forms.ChoiceField(choices=HardAction.choices, initial=HardAction.NOTIFY_ONLY, label="At the cap")


class BudgetForm(BudgetNumbersForm):
    """A new budget: for a project (tenant admins), or for the tenant itself (operators: the empty choice)."""

    project = forms.ChoiceField()
    unit = forms.ChoiceField(choices=BudgetUnit.choices, initial=BudgetUnit.GPU_HOURS)
    field_order = ["project", "unit"]

    def __init__(self, *args: Any, project_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "project", project_choices)


class AskForm(forms.Form):
    """A request for more: quota in a pool (the new guarantee and limit) or budget (the extra amount)."""

    kind = forms.ChoiceField(choices=RequestKind.choices, initial=RequestKind.BUDGET, label="For more")
    project = forms.ChoiceField()
    pool = forms.ChoiceField(required=False, help_text="Quota: the pool.")
    guaranteed = forms.IntegerField(required=False, label="Guaranteed GPUs", help_text="Quota: the new guarantee.")
    limit = forms.IntegerField(required=False, label="Limit (GPUs)", help_text="Quota: the new limit.")
    unit = forms.ChoiceField(
        choices=[("", "—"), *BudgetUnit.choices], required=False, help_text="Budget: which budget."
    )
    extra = forms.DecimalField(max_digits=16, decimal_places=4, required=False, help_text="Budget: how much more.")
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=2000)
    ends_at = _moment("Until")

    def __init__(
        self, *args: Any, project_choices: list[tuple[str, str]], pool_choices: list[tuple[str, str]], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "project", project_choices)
        _choices(self, "pool", [("", "—"), *pool_choices])


class DecisionForm(forms.Form):
    """A decision's note for the requester."""

    note = forms.CharField(required=False, max_length=2000, widget=forms.TextInput(attrs={"placeholder": "Note"}))
