"""Small renderables several commands share: a state in its colour, GPUs as people read them, brief tables.

Imported only inside commands (it imports rich).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from gpucloud_client.cli.output import make_table

if TYPE_CHECKING:
    from gpucloud_client.models import LaunchStep, Workload

_STATE_STYLES = {
    "pending": "yellow",
    "scheduled": "cyan",
    "starting": "cyan",
    "running": "green",
    "preempted": "magenta",
    "hibernated": "blue",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "dim",
    "lost": "red",
}


def state_text(state: str) -> Text:
    """Return `state` coloured by what it means (running green, failed red, ...)."""
    return Text(state or "-", style=_STATE_STYLES.get(state, ""))


def gpus_text(per_replica: int, replicas: int) -> str:
    """Return a workload's GPUs as people read them: "2", or "2x4" for a gang of 4 replicas of 2 GPUs."""
    return str(per_replica) if replicas == 1 else f"{per_replica}x{replicas}"


def workloads_brief(workloads: Sequence[Workload]) -> Table:
    """Return the short table an action or a submission answers with: id, name, kind, state, reason."""
    rows = [(w.id, w.name, w.kind, w.project, state_text(w.state), w.reason_code) for w in workloads]
    return make_table(("ID", "NAME", "KIND", "PROJECT", "STATE", "REASON"), rows)


_STEP_MARKS = {"done": ("✓", "green"), "current": (">", "bold yellow"), "next": ("·", "dim")}


def launch_steps_table(steps: Sequence[LaunchStep], *, spinner: bool = False) -> Table:
    """Return a workload's launch steps, one a row: done ones ticked, the current one marked (or spinning)."""
    from rich.spinner import Spinner

    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(width=2)
    table.add_column()
    table.add_column(style="dim", overflow="fold")
    for step in steps:
        mark, style = _STEP_MARKS.get(step.status, ("·", "dim"))
        first: Text | Spinner = Text(mark, style=style)
        if spinner and step.status == "current":
            first = Spinner("dots", style="yellow")
        table.add_row(first, Text(step.label, style="" if step.status != "next" else "dim"), step.detail or "")
    return table
