"""Accounting's answers to the jobs app's questions (`jobs.accounting_port`), registered when Django starts."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

from accounting.choices import HardAction
from accounting.selectors.budget_notes import launch_notes, most_gpu_seconds
from accounting.selectors.budgets import budget_states, budgets_holding
from accounting.selectors.decayed import decayed_gpu_seconds
from jobs.accounting_port import UsageOwner
from jobs.scheduler import core
from tenants.models import Project

# The hard actions the scheduler core enforces on running work; refuse_new is the submission's.
_CORE_ACTIONS = (HardAction.STOP_BORROWING.value, HardAction.STOP_RUNNING.value)


class JobsAccounting:
    """`jobs.accounting_port.AccountingPort` over accounting's selectors."""

    def refusing_new_work(self, projects: Collection[Project], *, now: datetime) -> dict[int, str]:
        held = budgets_holding(projects, HardAction.REFUSE_NEW, now=now)
        return {project_id: state.describe() for project_id, state in held.items()}

    def enforced_budgets(self, *, now: datetime) -> tuple[core.BudgetState, ...]:
        return tuple(
            core.BudgetState(
                tenant=state.budget.tenant.slug,
                project=state.budget.project.slug if state.budget.project is not None else None,
                action=core.BudgetAction(state.budget.hard_action),
                used=float(state.used),
                amount=float(state.amount),
                unit=state.unit_label,
                period=state.period_label,
            )
            for state in budget_states(now=now, actions=_CORE_ACTIONS)
            if state.in_force
        )

    def decayed_gpu_seconds(self, *, now: datetime, half_lives: Mapping[int, int]) -> dict[UsageOwner, float]:
        return decayed_gpu_seconds(now=now, half_lives=half_lives)

    def launch_notes(self, project: Project, jobs: Sequence[tuple[int, int | None]], *, now: datetime) -> list[str]:
        return launch_notes(project, most_gpu_seconds(jobs), now=now, count=len(jobs))
