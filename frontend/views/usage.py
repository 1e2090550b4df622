"""Usage pages: what a tenant (or, for operators, every tenant) used and what it cost, a tenant's monthly
statement, and the operators' prices.

Thin adapters: the figures are `accounting.selectors`' reports, the query
parameters `accounting.options.report_options`' (their errors land on the
filter form, every failing field at once), the columns `accounting.export`'s,
and prices are added and removed by `accounting.services`. Times are UTC, as
accounting cuts them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounting import selectors, services
from accounting.choices import Dimension
from accounting.export import DIMENSION_LABELS, csv_response, measures
from accounting.models import Price
from accounting.options import PLATFORM_DIMENSIONS, TENANT_DIMENSIONS, ReportOptions, report_options
from accounting.periods import Period, month_start, next_month
from accounting.selectors import Report
from common.errors import Conflict
from frontend.access import Page, actor_of, operator_view, tenant_view
from frontend.forms import apply_service_errors
from frontend.forms.accounting import MonthForm, PriceForm, UsageFilterForm
from frontend.views import again, attempt
from inventory import selectors as inventory_selectors
from tenants.choices import Role

TENANT_BY = "project,user"
PLATFORM_BY = "tenant,pool"
STATEMENT_BY = (Dimension.PROJECT, Dimension.GPU_MODEL)
# Groupings the "group by" field suggests; any other allowed one may be typed.
SUGGESTED_BY = ["project", "project,user", "user", "pool", "gpu_model", "project,gpu_model", "workload"]
CHART_GROUPS = 8  # the daily chart's colours: past this many groups, the smallest share one, "other"
DAILY_UP_TO = timedelta(days=93)  # longer periods are charted by month: each bar costs a pair of queries
LOW_UTILIZATION = Decimal(30)  # percent: a group whose GPUs were busier less than this is flagged

Reader = Callable[..., Report]  # platform_report, or tenant_report bound to its tenant


@dataclass(frozen=True)
class StackedChart:
    """GPU-hours per bucket (day or month) of each group, the largest group first; `starts` are the buckets'."""

    bucket: str
    starts: list[datetime]
    labels: list[str]
    values: list[list[float]]  # per group, per bucket

    def as_json(self) -> dict[str, Any]:
        x = [int(start.timestamp()) for start in self.starts]
        series = [{"label": label, "values": values} for label, values in zip(self.labels, self.values, strict=True)]
        return {"bucket": self.bucket, "x": x, "series": series}

    @property
    def table(self) -> list[tuple[datetime, list[float]]]:
        """The same figures by bucket: what the chart draws, for readers without it."""
        return [(start, [values[i] for values in self.values]) for i, start in enumerate(self.starts)]


@dataclass(frozen=True)
class EfficiencyBar:
    """One group in the efficiency chart: what it cost (GPU-hours while nothing has a price), how much of that
    held idle GPUs, and how busy its GPUs were; widths are percent of the widest bar and of this one."""

    label: str
    amount: Decimal
    idle: Decimal
    utilization: Decimal | None
    width: float
    idle_width: float

    @property
    def low(self) -> bool:
        return self.utilization is not None and self.utilization < LOW_UTILIZATION


@dataclass(frozen=True)
class StatementLine:
    """One line of a statement: a project's use of one GPU model (none: CPU-only work), its figures and amount."""

    project: str
    gpu_model: str
    figures: dict[str, Any]


@dataclass(frozen=True)
class PriceLine:
    """A price and where it stands now: `scheduled`, `in effect` or `superseded`; `until` is its key's next date."""

    price: Price
    state: str
    until: datetime | None


def _asked(
    request: HttpRequest, allowed: Collection[str], default_by: str, now: datetime
) -> tuple[UsageFilterForm, ReportOptions | None]:
    """Return the filter form for the query string and the report it asks for; None, with every bad parameter's
    error on the form, when some parameter is bad."""
    form = UsageFilterForm(request.GET.dict(), allowed=allowed, default_by=default_by)
    form.is_valid()  # every field takes any text: this readies the form for the rules' errors
    try:
        return form, report_options(dict(form.data), allowed=allowed, default_by=default_by, now=now)
    except ValidationError as error:
        apply_service_errors(form, error)
        return form, None


def _chart_bucket(period: Period) -> str:
    return "day" if period.end - period.start <= DAILY_UP_TO else "month"


def _stacked(report: Report) -> StackedChart:
    """Return the GPU-hours of `report`'s series (grouped by one dimension) per group, CHART_GROUPS at most."""
    keys = [row.key for row in report.rows if row.usage.gpu_seconds > 0]
    named = keys if len(keys) <= CHART_GROUPS else keys[: CHART_GROUPS - 1]
    index = {key: i for i, key in enumerate(named)}
    labels = [key[0] or "—" for key in named] + (["other"] if len(named) < len(keys) else [])
    values = [[0.0] * len(report.series) for _ in labels]
    for column, (_, rows) in enumerate(report.series):
        for row in rows:
            if row.usage.gpu_seconds > 0:
                values[index.get(row.key, len(named))][column] += row.usage.gpu_hours
    rounded = [[round(value, 3) for value in group] for group in values]
    return StackedChart(report.bucket, [start for start, _ in report.series], labels, rounded)


def _efficiency(report: Report) -> list[EfficiencyBar]:
    """Return a bar per group of `report` that held a GPU, costliest first (largest use while nothing is priced)."""
    amount, idle = ("cost", "idle_cost") if report.total.cost > 0 else ("gpu_hours", "idle_gpu_hours")
    groups = [(row.key[0] or "—", measures(row.usage)) for row in report.rows if row.usage.gpu_seconds > 0]
    widest = max((figures[amount] for _, figures in groups), default=Decimal(0)) or Decimal(1)
    bars = [
        EfficiencyBar(
            label=label,
            amount=figures[amount],
            idle=figures[idle],
            utilization=figures["utilization_percent"],
            width=float(figures[amount] / widest * 100),
            idle_width=float(figures[idle] / figures[amount] * 100) if figures[amount] else 0.0,
        )
        for label, figures in groups
    ]
    return sorted(bars, key=lambda bar: (-bar.amount, bar.label))


def _usage_context(
    form: UsageFilterForm, options: ReportOptions | None, read: Reader, stack_by: str, now: datetime
) -> dict[str, Any]:
    """Return what a usage page shows: the form, and (when the parameters are good) the report's totals, its
    table, GPU-hours per day stacked by `stack_by` and each `stack_by` group's cost against its utilization."""
    context: dict[str, Any] = {"form": form, "suggested_by": SUGGESTED_BY, "stack_label": DIMENSION_LABELS[stack_by]}
    if options is None:
        return context
    report = read(options.period, options.group_by, now=now)
    stacked = read(options.period, [stack_by], now=now, bucket=_chart_bucket(options.period))
    return {
        **context,
        "report": report,
        "ongoing": report.period.end > now,
        "totals": measures(report.total),
        "dimensions": [DIMENSION_LABELS[dim] for dim in report.group_by],
        "rows": [(row.key, measures(row.usage)) for row in report.rows],
        "chart": _stacked(stacked),
        "efficiency": _efficiency(stacked),
        "idle_below": settings.NOTEBOOK_IDLE_UTILIZATION,
        "low_utilization": LOW_UTILIZATION,
    }


@tenant_view(Role.ADMIN)
def usage(request: HttpRequest, page: Page) -> HttpResponse:
    """The tenant's usage in a period (`period`, `start`, `end`), grouped by `by` (default project,user; not
    tenant): totals, a table, GPU-hours per day by project, cost against utilization by project. Bad
    parameters show their errors on the form, every one at once."""
    now = timezone.now()
    form, options = _asked(request, TENANT_DIMENSIONS, TENANT_BY, now)
    context = _usage_context(form, options, partial(selectors.tenant_report, page.tenant), Dimension.PROJECT, now)
    export = reverse("frontend:usage_export", args=[page.tenant.slug])
    return render(request, "frontend/usage.html", {**context, "page": page, "export_url": export})


@operator_view
def ops_usage(request: HttpRequest) -> HttpResponse:
    """Every tenant's usage, as the tenant page shows one's: grouped by `by` (default tenant,pool), charted by
    tenant. Operators only."""
    now = timezone.now()
    form, options = _asked(request, PLATFORM_DIMENSIONS, PLATFORM_BY, now)
    context = _usage_context(form, options, selectors.platform_report, Dimension.TENANT, now)
    return render(request, "frontend/ops_usage.html", {**context, "export_url": reverse("frontend:ops_usage_export")})


def _refused(form: UsageFilterForm) -> HttpResponse:
    """Answer a CSV export's bad parameters: 400, each error by field, as text."""
    lines = [f"{field}: {' '.join(str(error) for error in errors)}" for field, errors in form.errors.items()]
    return HttpResponseBadRequest("\n".join(lines), content_type="text/plain; charset=utf-8")


@tenant_view(Role.ADMIN)
def usage_export(request: HttpRequest, page: Page) -> HttpResponse:
    """The usage page's report as CSV (with `bucket`=day or month, a row per bucket and group); 400 naming
    every bad parameter."""
    now = timezone.now()
    form, options = _asked(request, TENANT_DIMENSIONS, TENANT_BY, now)
    if options is None:
        return _refused(form)
    report = selectors.tenant_report(page.tenant, options.period, options.group_by, now=now, bucket=options.bucket)
    return csv_response(report, page.tenant.slug)  # type: ignore[return-value]  # streamed alike, as audit_export


@operator_view
def ops_usage_export(request: HttpRequest) -> HttpResponse:
    """Every tenant's usage as CSV, as ops_usage reports it; 400 naming every bad parameter. Operators only."""
    now = timezone.now()
    form, options = _asked(request, PLATFORM_DIMENSIONS, PLATFORM_BY, now)
    if options is None:
        return _refused(form)
    report = selectors.platform_report(options.period, options.group_by, now=now, bucket=options.bucket)
    return csv_response(report, "platform")  # type: ignore[return-value]  # streamed alike, as audit_export


def _statement_lines(report: Report) -> list[StatementLine]:
    lines = [StatementLine(row.key[0], row.key[1], measures(row.usage)) for row in report.rows]
    return sorted(lines, key=lambda line: (line.project, line.gpu_model == "", line.gpu_model))


def _statement_context(page: Page, month: datetime, now: datetime) -> dict[str, Any]:
    """Return a month's statement: its lines by project and GPU model, and their total (the sum of the amounts
    as shown, to the cent, as an invoice adds up)."""
    period = Period("custom", month, next_month(month))
    report = selectors.tenant_report(page.tenant, period, STATEMENT_BY, now=now)
    lines = _statement_lines(report)
    following = next_month(month)
    return {
        "report": report,
        "lines": lines,
        "total": sum((line.figures["cost"] for line in lines), Decimal("0.00")),
        "ongoing": period.end > now,
        "last_day": period.end - timedelta(days=1),
        "previous_month": month_start(month - timedelta(days=1)),
        "next_month": following if following <= month_start(now) else None,
    }


@tenant_view(Role.ADMIN)
def statement(request: HttpRequest, page: Page) -> HttpResponse:
    """A month's statement (`month`=YYYY-MM, UTC; default last month), read like an invoice: a line per project
    and GPU model with its hours and amount, and the total. A bad month shows its error."""
    now = timezone.now()
    last_month = month_start(month_start(now) - timedelta(days=1))
    form = MonthForm({"month": f"{last_month:%Y-%m}", **request.GET.dict()}, now=now)
    context: dict[str, Any] = {"page": page, "form": form, "issued": now}
    if form.is_valid():
        context.update(_statement_context(page, form.cleaned_data["month"], now))
    return render(request, "frontend/statement.html", context)


def price_lines(prices: Iterable[Price], now: datetime) -> list[PriceLine]:
    """Return `prices` (newest first within each key, as `selectors.prices` orders them) with where each stands
    at `now`: the newest of a key in effect is `in effect`, older ones `superseded`, later ones `scheduled`."""
    lines = []
    newer: dict[tuple[str, int | None, str], datetime] = {}  # each key's date after the price at hand
    for price in prices:
        key = (price.resource, price.pool_id, price.gpu_model)
        if price.effective_from > now:
            state = "scheduled"
        else:
            state = "in effect" if key not in newer or newer[key] > now else "superseded"
        lines.append(PriceLine(price, state, newer.get(key)))
        newer[key] = price.effective_from
    return lines


@operator_view
def ops_prices(request: HttpRequest) -> HttpResponse:
    """Prices with their history; a POST adds one through `add_price`, whose errors land on the form's fields,
    every failing one at once (nothing is written then). Operators only."""
    pools = [pool.name for pool in inventory_selectors.pools_visible_to(actor_of(request)).order_by("name")]
    form = PriceForm(request.POST if request.method == "POST" else None, pool_names=pools)
    now = timezone.now()
    if form.is_valid() and attempt(
        form, lambda: services.add_price(actor=actor_of(request), now=now, **form.cleaned_data)
    ):
        messages.success(request, "Price added.")
        return again(request)
    models = sorted(set(inventory_selectors.gpus_for_operators().values_list("model", flat=True)))
    context = {"form": form, "prices": price_lines(selectors.prices(), now), "gpu_models": models}
    return render(request, "frontend/ops_prices.html", {**context, "currency": settings.ACCOUNTING_CURRENCY})


@require_POST
@operator_view
def ops_price_remove(request: HttpRequest, pk: int) -> HttpResponse:
    """Remove a price not yet in effect; one in effect (or that was) stays, and the page says why."""
    price = get_object_or_404(selectors.prices(), pk=pk)
    try:
        services.remove_price(actor=actor_of(request), price=price, now=timezone.now())
    except Conflict as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"The price from {price.effective_from:%Y-%m-%d %H:%M} UTC is removed.")
    return redirect("frontend:ops_prices")
