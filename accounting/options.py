"""What a usage report is asked for (period, grouping, buckets), read from a request's parameters once for all.

The API, the pages and the CSV exports read their parameters here, so each
names the same fields with the same rules, every failing one at once.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from django.core.exceptions import ValidationError

from accounting.choices import Dimension
from accounting.periods import BUCKETS, NAMED_PERIODS, Period, resolve_period
from common.errors import FieldErrors, add_errors, invalid, raise_errors

TENANT_DIMENSIONS = tuple(d.value for d in Dimension if d != Dimension.TENANT)
PLATFORM_DIMENSIONS = tuple(d.value for d in Dimension)
MAX_DIMENSIONS = 3


@dataclass(frozen=True)
class ReportOptions:
    """A report's period, its grouping (dimension values in order) and its bucket ("" for none)."""

    period: Period
    group_by: tuple[str, ...]
    bucket: str = ""


def report_options(
    params: dict[str, str], *, allowed: Collection[str], default_by: str, now: datetime, blank_is_default: bool = True
) -> ReportOptions:
    """Return the report asked for by `params` (`period`, `start`, `end`, `by`, `bucket`).

    A blank `period` or `bucket` is the default (a page's form sends its
    "none" choice so) when `blank_is_default`, else `blank` (the API, whose
    schema lists their choices: leave a parameter out for its default).

    `by` is a comma-separated list of up to MAX_DIMENSIONS of `allowed`
    (default `default_by`; empty for totals only). Raises ValidationError
    naming every failing field at once (`period`, `start`, `end`: see
    resolve_period; `by`: `invalid_choice`, `duplicate`, `too_many`;
    `bucket`: `invalid_choice`; `period`, `bucket`: `blank`).
    """
    errors: FieldErrors = {}
    if not blank_is_default:
        for name, choices in (("period", NAMED_PERIODS), ("bucket", BUCKETS)):
            if params.get(name) == "":
                message = f"Leave {name} out for the default, or choose one of {', '.join(choices)}."
                add_errors(errors, invalid(name, "blank", message))
    period: Period | None = None
    try:
        period = resolve_period(
            name=params.get("period", ""), start=params.get("start", ""), end=params.get("end", ""), now=now
        )
    except ValidationError as error:
        add_errors(errors, error)
    by = params.get("by", default_by)
    group_by = tuple(name.strip() for name in by.split(",") if name.strip())
    unknown = [name for name in group_by if name not in allowed]
    if unknown:
        add_errors(
            errors,
            invalid("by", "invalid_choice", f"Group by {', '.join(allowed)}; not {', '.join(unknown)}."),
        )
    elif len(set(group_by)) != len(group_by):
        add_errors(errors, invalid("by", "duplicate", "Name each dimension once."))
    elif len(group_by) > MAX_DIMENSIONS:
        add_errors(errors, invalid("by", "too_many", f"Group by at most {MAX_DIMENSIONS} dimensions."))
    bucket = params.get("bucket", "")
    if bucket and bucket not in BUCKETS:
        add_errors(errors, invalid("bucket", "invalid_choice", f"Choose one of {', '.join(BUCKETS)}, or none."))
    raise_errors(errors)
    assert period is not None  # no error was found, so the period parsed
    return ReportOptions(period, group_by, bucket)
