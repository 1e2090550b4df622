"""`gpc quota` (what may be used, per project and pool) and `gpc usage` (what is in use against it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpucloud_client.cli.state import AppState

if TYPE_CHECKING:
    from rich.table import Table

    from gpucloud_client.models import Quota, QuotaUse

pass_state = click.make_pass_decorator(AppState, ensure=True)
TENANT_ROW = "(tenant)"  # how the tenant's own quota reads in the project column


@click.command()
@pass_state
def quota(state: AppState) -> None:
    """Show the GPU quotas: the tenant's per pool, then each project's inside it.

    Guaranteed GPUs are always available; the limit caps what may be held, borrowing included (`-`: none).
    -o json|yaml prints {"tenant": [...], "projects": [...]} as the API lists them.
    """
    from gpucloud_client.cli.output import emit

    with state.client() as client:
        tenant, projects = client.quotas(), client.project_quotas()
    data = {"tenant": [q.raw for q in tenant], "projects": [q.raw for q in projects]}
    emit(state.output, data, lambda: quota_table([*tenant, *projects]))


def quota_table(quotas: list[Quota]) -> Table:
    """Return one row per quota: the tenant's (project `(tenant)`) first, then the projects', by pool."""
    from gpucloud_client.cli.output import make_table

    def runtime(seconds: int | None) -> str | None:
        return f"{seconds} s" if seconds else None

    ordered = sorted(quotas, key=lambda q: (q.project is not None, q.project or "", q.pool))
    rows = [
        (
            q.project or TENANT_ROW,
            q.pool,
            q.guaranteed,
            q.limit,
            q.weight,
            q.max_notebooks_per_user,
            q.max_pending_workloads,
            runtime(q.max_runtime_seconds),
        )
        for q in ordered
    ]
    columns = ("PROJECT", "POOL", "GUARANTEED", "LIMIT", "WEIGHT", "NOTEBOOKS/USER", "MAX PENDING", "MAX RUNTIME")
    return make_table(columns, rows)


@click.command()
@pass_state
def usage(state: AppState) -> None:
    """Show the GPUs in use now against each quota: held, borrowed above the guarantee, running and pending."""
    from gpucloud_client.cli.output import emit

    with state.client() as client:
        uses = client.usage()
    emit(state.output, {"quotas": [u.raw for u in uses]}, lambda: usage_table(uses))


def usage_table(uses: list[QuotaUse]) -> Table:
    """Return one row per quota with what is in use against it ("3/8" GPUs of the limit)."""
    from gpucloud_client.cli.output import make_table

    rows = [
        (
            u.project or TENANT_ROW,
            u.pool,
            f"{u.in_use}/{u.limit}" if u.limit is not None else f"{u.in_use}",
            u.guaranteed,
            u.limit,
            u.borrowed,
            u.running,
            u.pending,
        )
        for u in uses
    ]
    columns = ("PROJECT", "POOL", "IN USE", "GUARANTEED", "LIMIT", "BORROWED", "RUNNING", "PENDING")
    return make_table(columns, rows)


COMMANDS = [quota, usage]
