"""What the budgets say to someone about to launch work: "This job may use up to N of your remaining M GPU-hours".

One sentence per budget in force that the work's project answers to (its
own, then its tenant's), the same on the launch page and in the API's
dry-run answers (and so in `gpc submit --dry-run`). A job without a runtime
limit may use all that remains; a money budget says what remains of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from accounting.choices import BudgetUnit
from accounting.selectors.budgets import BudgetState, states_for_project
from tenants.models import Project

_TENTH = Decimal("0.1")
_HOUR = Decimal(3600)


def most_gpu_seconds(jobs: Iterable[tuple[int, int | None]]) -> int | None:
    """Return the GPU-seconds that work of `jobs` ((GPUs, maximum runtime in seconds or None) each) may use at
    most, or None when any job has no runtime limit."""
    total = 0
    for gpus, runtime in jobs:
        if not runtime:
            return None
        total += max(0, gpus) * runtime
    return total


def launch_notes(project: Project | None, gpu_seconds: int | None, *, now: datetime, count: int = 1) -> list[str]:
    """Return one sentence per budget in force over `project` about `count` workloads ("This job", "These 3
    workloads") that may use `gpu_seconds` at most (None: no runtime limit); none without a project or budgets."""
    if project is None:
        return []
    return [_note(state, gpu_seconds, count) for state in states_for_project(project, now=now)]


def _note(state: BudgetState, gpu_seconds: int | None, count: int) -> str:
    whose = f"{state.owner_label}'s budget {state.period_label}"
    remaining = _amount(state.remaining)
    if state.exhausted:
        return f"The {whose} is used up ({_amount(state.used)} of {_amount(state.amount)} {state.unit_label})."
    if state.budget.unit != BudgetUnit.GPU_HOURS:
        return f"{remaining} {state.unit_label} of the {whose} remain."
    subject, has, it = ("This job", "has", "it") if count == 1 else (f"These {count} workloads", "have", "they")
    if gpu_seconds is not None:
        most = _amount(Decimal(gpu_seconds) / _HOUR)
        return f"{subject} may use up to {most} of your remaining {remaining} GPU-hours ({whose})."
    return f"{subject} {has} no runtime limit: {it} may use all of your remaining {remaining} GPU-hours ({whose})."


def _amount(value: Decimal) -> str:
    return f"{value.quantize(_TENTH):,}"
