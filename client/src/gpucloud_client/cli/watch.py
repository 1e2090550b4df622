"""`gpc ls --watch`: the workload list kept live from the tenant's events stream.

On a terminal the table redraws in place (rich Live) until q or Ctrl-C; piped, it prints one line per
change; with -o json|yaml, one object per row of the events stream (the snapshot's rows first).
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import RenderableType

    from gpucloud_client.aclient import AsyncClient
    from gpucloud_client.cli.state import AppState
    from gpucloud_client.cli.workloads import ListFilters
    from gpucloud_client.models import Workload, WorkloadRow


@dataclass
class Entry:
    """One workload as the live table shows it; `owner`, `pool` and `gpus` are None until known."""

    id: int
    name: str
    kind: str
    project: str
    state: str
    reason: str
    queue: int | None
    updated: str | None
    owner: str | None = None
    pool: str | None = None
    gpus: str | None = None

    @classmethod
    def of_workload(cls, w: Workload) -> Entry:
        """Return the entry of a workload read from the API's list."""
        from gpucloud_client.cli.views import gpus_text

        return cls(
            w.id, w.name, w.kind, w.project, w.state, w.reason_code, w.queue_position, w.submitted_at,
            owner=w.owner, pool=w.pool, gpus=gpus_text(w.gpus_per_replica, w.replicas),
        )  # fmt: skip

    def apply(self, row: WorkloadRow) -> None:
        """Take a row's state, reason, queue position and time."""
        self.state, self.reason, self.queue, self.updated = (
            row.state,
            row.reason_code,
            row.queue_position,
            row.updated_at,
        )


class WatchModel:
    """The workloads on show, updated row by row from the events stream, filtered as `ls` was."""

    def __init__(self, initial: list[Workload], filters: ListFilters) -> None:
        self.filters = filters
        self.entries: dict[int, Entry] = {w.id: Entry.of_workload(w) for w in initial}
        self.rejected: set[int] = set()  # new workloads whose owner or pool `ls` filters out

    def needs_lookup(self, row: WorkloadRow) -> bool:
        """Return whether a workload new to the table must be read first: the rows carry no owner, pool or GPUs.

        Once per workload: one the filters turn away, or one already shown, is not read again.
        """
        return row.id not in self.entries and row.id not in self.rejected and self._shows(row, known=False)

    def apply(self, row: WorkloadRow, workload: Workload | None = None) -> bool:
        """Apply one row (with the workload read for it, if any); return whether the table changed."""
        if row.id in self.rejected:
            return False
        entry = self.entries.get(row.id)
        if not self._shows(row, known=entry is not None):
            return self.entries.pop(row.id, None) is not None
        if entry is None:
            if workload is not None and not self._admits(workload):
                self.rejected.add(row.id)
                return False
            entry = (
                Entry.of_workload(workload)
                if workload
                else Entry(row.id, row.name, row.kind, row.project, "", "", None, None)
            )
            self.entries[row.id] = entry
        entry.apply(row)
        return True

    def _shows(self, row: WorkloadRow, *, known: bool) -> bool:
        """Return whether the row belongs on show: a workload on show that ends stays, with its final state."""
        from gpucloud_client.cli.workloads import NOT_ENDED

        if self.filters.kind and row.kind != self.filters.kind:
            return False
        if self.filters.state:
            return row.state == self.filters.state
        return known or self.filters.show_all or row.state in NOT_ENDED

    def _admits(self, workload: Workload) -> bool:
        owner, pool = self.filters.owner, self.filters.pool
        return (not owner or workload.owner == owner) and (not pool or workload.pool == pool)

    def render(self, title: str) -> RenderableType:
        """Return the live table under `title`, newest first."""
        from rich.console import Group
        from rich.text import Text

        from gpucloud_client.cli.output import ago, make_table
        from gpucloud_client.cli.views import state_text

        columns = ("ID", "NAME", "KIND", "PROJECT", "OWNER", "STATE", "GPUS", "QUEUE", "REASON", "UPDATED")
        ordered = sorted(self.entries.values(), key=lambda e: e.id, reverse=True)
        rows = [
            (e.id, e.name, e.kind, e.project, e.owner, state_text(e.state), e.gpus, e.queue, e.reason, ago(e.updated))
            for e in ordered
        ]
        return Group(Text(title, style="dim"), make_table(columns, rows))


def watch_workloads(state: AppState, initial: list[Workload], filters: ListFilters) -> None:
    """Follow the events stream until q or Ctrl-C (see the module for the three ways it prints)."""
    asyncio.run(_watch(state, initial, filters))


async def _watch(state: AppState, initial: list[Workload], filters: ListFilters) -> None:
    client = state.aclient()
    try:
        if state.structured:
            await _records(client, filters, state.output)
        else:
            await _table(client, WatchModel(initial, filters), state.context().tenant or "")
    finally:
        await client.aclose()


async def _records(client: AsyncClient, filters: ListFilters, fmt: str) -> None:
    """Print every row of the stream that passes the filters, as JSON lines or YAML documents."""
    from gpucloud_client.cli.output import emit_record

    model = WatchModel([], filters)
    async for row in client.watch(filters.project):
        workload = await client.workload(row.id) if model.needs_lookup(row) else None
        if model.apply(row, workload) or row.id in model.entries:
            emit_record(fmt, row.raw)


async def _table(client: AsyncClient, model: WatchModel, tenant: str) -> None:
    """Keep the table live on a terminal, or print one line per change when stdout is not one."""
    from gpucloud_client.cli.live import run_live

    changed = asyncio.Event()
    title = f"workloads of {tenant} (live; q quits)"
    if not sys.stdout.isatty():
        await _lines(client, model)
        return
    await run_live(lambda: model.render(title), [_follow(client, model, changed)], changed, interval=5.0)


async def _follow(client: AsyncClient, model: WatchModel, changed: asyncio.Event) -> None:
    """Apply the stream's rows to the model, signalling each change."""
    async for row in client.watch(model.filters.project):
        workload = await client.workload(row.id) if model.needs_lookup(row) else None
        if model.apply(row, workload):
            changed.set()


async def _lines(client: AsyncClient, model: WatchModel) -> None:
    """Print `<updated> <id> <name> <state> <#queue> <reason>` for every change (for pipes and logs)."""
    import click

    printed: dict[int, tuple[str, int | None, str]] = {}
    async for row in client.watch(model.filters.project):
        workload = await client.workload(row.id) if model.needs_lookup(row) else None
        seen = (row.state, row.queue_position, row.reason_code)
        # A row may come again unchanged (a replica started, GPUs released): a line says only what changed.
        if model.apply(row, workload) and printed.get(row.id) != seen:
            printed[row.id] = seen
            queue = f"#{row.queue_position}" if row.queue_position is not None else "-"
            click.echo(f"{row.updated_at or '-'} {row.id} {row.name} {row.state} {queue} {row.reason_code or '-'}")
