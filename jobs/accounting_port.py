"""What the jobs app asks of accounting, which sits above it: budgets in force, decayed usage, launch notes.

Accounting reads the ledger jobs writes (`jobs.models.Allocation`), so jobs
may not import it back. Instead jobs states here the few questions it asks,
and accounting answers them with one implementation registered when Django
starts (`accounting.apps.AccountingConfig.ready`). Asking before one is
registered raises ImproperlyConfigured: a budget is never skipped silently.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from django.core.exceptions import ImproperlyConfigured

from jobs.scheduler import core
from tenants.models import Project

# (pool id, tenant id, project id): whose decayed usage, in which pool.
UsageOwner = tuple[int, int, int]


class AccountingPort(Protocol):
    """The questions jobs asks of accounting; each answer is read at `now`, in a few queries for any number."""

    def refusing_new_work(self, projects: Collection[Project], *, now: datetime) -> dict[int, str]:
        """Return, by project id, one sentence on the used-up budget that refuses new work into each of
        `projects` that has one (its own, else its tenant's)."""
        ...

    def enforced_budgets(self, *, now: datetime) -> tuple[core.BudgetState, ...]:
        """Return the budgets in force whose hard action the scheduler core enforces, with what was used."""
        ...

    def decayed_gpu_seconds(self, *, now: datetime, half_lives: Mapping[int, int]) -> dict[UsageOwner, float]:
        """Return each owner's GPU-seconds per pool, a past second weighing 2^(-age / the pool's half-life)."""
        ...

    def launch_notes(self, project: Project, jobs: Sequence[tuple[int, int | None]], *, now: datetime) -> list[str]:
        """Return what the budgets over `project` say about work of `jobs` ((GPUs, maximum runtime in seconds
        or None) each)."""
        ...


_registered: list[AccountingPort] = []


def register_accounting(port: AccountingPort) -> None:
    """Make `port` the one answering jobs' questions (a second registration replaces the first)."""
    _registered[:] = [port]


def accounting() -> AccountingPort:
    """Return the registered accounting; raises ImproperlyConfigured when the accounting app is not loaded."""
    if not _registered:
        raise ImproperlyConfigured("jobs asks accounting about budgets, but no accounting is registered")
    return _registered[0]
