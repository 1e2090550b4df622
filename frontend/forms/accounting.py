"""Forms of the usage pages: a report's period and grouping, a statement's month, a price to add.

Input shapes only: the rules are accounting's (`accounting.options.report_options`,
`accounting.services.add_price`), whose errors land on these fields, every
failing one at once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from accounting.choices import Resource
from accounting.periods import month_start
from frontend.forms.base import _choices

PERIOD_CHOICES = [("this-month", "This month"), ("last-month", "Last month"), ("custom", "Custom dates")]
EVERY_POOL = ""


class UsageFilterForm(forms.Form):
    """A report's period and grouping as the query string carries them. Every field takes any text: the
    rules (and their messages) are `report_options`', so a field never shows two errors for one mistake."""

    period = forms.CharField(required=False, widget=forms.Select(choices=PERIOD_CHOICES))
    start = forms.CharField(
        required=False,
        label="From (UTC)",
        widget=forms.DateInput(attrs={"type": "date", "data-only-with": "period=custom"}),
    )
    end = forms.CharField(
        required=False,
        label="Until (UTC, not included)",
        widget=forms.DateInput(attrs={"type": "date", "data-only-with": "period=custom"}),
    )
    by = forms.CharField(required=False, label="Group by", widget=forms.TextInput(attrs={"list": "usage-groupings"}))

    def __init__(self, query: Mapping[str, str], *, allowed: Collection[str], default_by: str) -> None:
        """Bind `query` with the defaults `report_options` applies filled in, so the form shows what is reported."""
        data = {"by": default_by, **query}
        if not data.get("period"):
            data["period"] = "custom" if data.get("start") or data.get("end") else "this-month"
        super().__init__(data)
        self.fields["by"].help_text = f"Comma-separated, at most 3 of: {', '.join(allowed)}. Empty: totals only."


class MonthForm(forms.Form):
    """A statement's month, `YYYY-MM` (UTC), no later than the current one."""

    month = forms.CharField(widget=forms.TextInput(attrs={"type": "month", "placeholder": "2026-03"}))

    def __init__(self, *args: Any, now: datetime, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.now = now

    def clean_month(self) -> datetime:
        """Return the month's first instant (UTC)."""
        value = self.cleaned_data["month"].strip()
        try:
            start = datetime.strptime(value, "%Y-%m").replace(tzinfo=UTC)
        except ValueError:
            raise ValidationError(f"Give a month as YYYY-MM, not {value!r}.", code="invalid_month") from None
        if start > month_start(self.now):
            raise ValidationError("That month has not begun: it has no statement yet.", code="future_month")
        return start


class PriceForm(forms.Form):
    """A price to add. Only the shapes are checked here (a number, a time); the rules are `add_price`'s."""

    resource = forms.ChoiceField(choices=Resource.choices)
    pool = forms.ChoiceField(required=False, help_text="A pool's own price beats the price for every pool.")
    gpu_model = forms.CharField(
        required=False,
        label="GPU model",
        widget=forms.TextInput(attrs={"list": "gpu-models", "data-only-with": f"resource={Resource.GPU}"}),
        help_text="GPU prices only; empty: every model. A model's price beats a pool's.",
    )
    amount_per_hour = forms.DecimalField(label="Amount per hour")
    effective_from = forms.DateTimeField(
        required=False,
        label="Effective from (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="Empty: now. Never in the past: reports of the past keep their prices.",
    )

    def __init__(self, *args: Any, pool_names: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "pool", [(EVERY_POOL, "— every pool —"), *((name, name) for name in pool_names)])
