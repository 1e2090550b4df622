"""A report as flat rows: the one column layout of the CSV export, the API's rows and the pages' tables."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from django.http import StreamingHttpResponse

from accounting.choices import Dimension
from accounting.selectors import Report, Usage

MEASURES = [
    "gpu_hours",
    "cpu_hours",
    "memory_gib_hours",
    "utilization_percent",
    "sampled_gpu_hours",
    "idle_gpu_hours",
    "cost",
    "idle_cost",
]
_HOURS = Decimal("0.000001")
_PERCENT = Decimal("0.1")
_CENT = Decimal("0.01")


def measures(usage: Usage) -> dict[str, Any]:
    """Return the figures of `usage` as report columns: hours to the microhour, cost to the cent."""
    utilization = usage.utilization
    return {
        "gpu_hours": _hours(usage.gpu_seconds),
        "cpu_hours": _hours(usage.cpu_seconds),
        "memory_gib_hours": _hours(usage.memory_gib_seconds),
        "utilization_percent": None if utilization is None else Decimal(repr(utilization)).quantize(_PERCENT),
        "sampled_gpu_hours": _hours(usage.sampled_gpu_seconds),
        "idle_gpu_hours": _hours(usage.idle_gpu_seconds),
        "cost": usage.cost.quantize(_CENT),
        "idle_cost": usage.idle_cost,
    }


def _hours(seconds: float) -> Decimal:
    return (Decimal(repr(seconds)) / Decimal(3600)).quantize(_HOURS)


def report_rows(report: Report) -> Iterator[dict[str, Any]]:
    """Yield one dict per row of `report`: its dimensions by name, then MEASURES (and `period_start` per bucket)."""
    if report.bucket:
        for start, rows in report.series:
            for row in rows:
                yield {
                    "period_start": start.isoformat(),
                    **dict(zip(report.group_by, row.key, strict=True)),
                    **measures(row.usage),
                }
        return
    for row in report.rows:
        yield {**dict(zip(report.group_by, row.key, strict=True)), **measures(row.usage)}


def csv_header(report: Report) -> list[str]:
    """Return the CSV columns of `report`: (period_start,) dimensions, MEASURES, currency."""
    return [*(["period_start"] if report.bucket else []), *report.group_by, *MEASURES, "currency"]


def csv_lines(report: Report) -> Iterator[list[str]]:
    """Yield the CSV export of `report`, header first; empty cells where a figure has no value.

    A name that a spreadsheet would read as a formula (a user name may start
    with `@`, `+` or `-`) is written with a leading apostrophe.
    """
    header = csv_header(report)
    yield header
    for row in report_rows(report):
        row["currency"] = report.currency
        yield [_cell(row.get(column)) for column in header]


def _cell(value: object) -> str:
    if value is None:
        return ""
    text = str(value)
    return f"'{text}" if isinstance(value, str) and text[:1] in _FORMULA_STARTS else text


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


DIMENSION_LABELS = dict(Dimension.choices)


class _Echo:
    """A file the csv writer writes to that hands each line back instead of keeping it."""

    def write(self, value: str) -> str:
        return value


def csv_response(report: Report, name: str) -> StreamingHttpResponse:
    """Stream `report` as CSV in `csv_lines`' columns, as a file named `usage-<name>-<start>-<end>.csv`
    (the end excluded, as in the period): the one export of the API and the pages."""
    writer = csv.writer(_Echo())
    lines: Iterator[str] = (writer.writerow(line) for line in csv_lines(report))
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    start, end = report.period.start, report.period.end
    response["Content-Disposition"] = f'attachment; filename="usage-{name}-{start:%Y%m%d}-{end:%Y%m%d}.csv"'
    return response
