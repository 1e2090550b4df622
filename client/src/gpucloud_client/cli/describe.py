"""What `gpc describe` shows of a workload: why it waits, where it runs, how it got there.

Imported only inside the command (it imports rich).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpucloud_client.cli.output import make_table, text
from gpucloud_client.cli.views import gpus_text, launch_steps_table, state_text

if TYPE_CHECKING:
    from rich.console import RenderableType

    from gpucloud_client.models import WorkloadDetail


def describe_view(detail: WorkloadDetail, console_url: str) -> RenderableType:
    """Return the whole description: fields, then GPUs held, launch steps and events when there are any."""
    parts: list[RenderableType] = [_fields(detail, console_url)]
    if detail.allocations:
        parts += [Text(""), _allocations(detail)]
    if detail.launch_steps:
        parts += [Text(""), Text("Launch steps", style="bold"), launch_steps_table(detail.launch_steps)]
    if detail.events:
        parts += [Text(""), _events(detail)]
    return Group(*parts)


def _fields(detail: WorkloadDetail, console_url: str) -> Table:
    """Return the key/value grid of the workload's own fields (only those that say something)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for label, value in _field_rows(detail, console_url):
        if value not in (None, "", []):
            grid.add_row(label, value if isinstance(value, Text) else text(value))
    return grid


def _field_rows(d: WorkloadDetail, console_url: str) -> list[tuple[str, Any]]:
    """Return (label, value) for every field describe shows, in reading order."""
    waiting = d.state in {"pending", "preempted"}
    return [
        ("ID", d.id),
        ("Name", d.name),
        ("Kind", d.kind),
        ("Project", d.project),
        ("Pool", d.pool),
        ("Owner", d.owner),
        ("State", state_text(d.state)),
        ("Reason", f"{d.reason_code}: {d.reason_message}" if d.reason_code else d.reason_message),
        ("Hint", d.reason_hint),
        ("Actions", ", ".join(d.actions)),  # the console's answer: the CLI never decides them itself
        ("Queue position", d.queue_position if waiting else None),
        (
            "Expected start",
            f"{d.estimated_start_at} ({d.estimate_basis})" if waiting and d.estimated_start_at else None,
        ),
        ("Reserved", _reservation(d.reservation) if waiting else None),
        (
            "Predicted run",
            f"{d.predicted_runtime_seconds} s ({d.prediction_basis})" if d.predicted_runtime_seconds else None,
        ),
        ("Preemptions", d.preemptions or None),
        ("Attempt", d.attempt),
        ("Exit code", d.exit_code),
        ("Image", d.image),
        ("Command", shlex.join(d.command) if d.command else None),
        ("Env", [f"{k}={v}" for k, v in sorted(d.env.items())]),
        ("GPUs", f"{gpus_text(d.gpus_per_replica, d.replicas)} ({', '.join(d.gpu_models) or 'any model'})"),
        ("CPU / memory", f"{d.cpu_milli / 1000:g} CPU, {d.memory_mib} MiB per replica"),
        (
            "Shared memory",
            f"{d.shm_mib} MiB per replica" if d.shm_mib is not None else "runtime default (Docker: 64 MiB)",
        ),
        ("Priority", d.priority_class),
        ("Max runtime", f"{d.max_runtime_seconds} s" if d.max_runtime_seconds else None),
        ("Submitted", d.submitted_at),
        ("Started", d.started_at),
        ("Finished", d.finished_at),
        ("Checkpointed", d.checkpointed_at),
        ("Notebook", f"{console_url.rstrip('/')}{d.notebook_url}" if d.notebook_url else None),
    ]


def _reservation(reservation: dict[str, Any] | None) -> str | None:
    """Return the GPUs reserved for a waiting workload and from when ("from T: node-1 (2 GPUs)"), or None."""
    if not reservation:
        return None
    replicas = reservation.get("replicas") or []
    where = ", ".join(f"{r.get('node')} ({len(r.get('gpus') or [])} GPUs)" for r in replicas)
    return f"from {reservation.get('from')}: {where}"


def _allocations(detail: WorkloadDetail) -> Table:
    """Return the GPUs (or nodes) the replicas hold or held."""
    rows = [
        (a.replica, a.node, a.gpu_index, a.gpu_model, a.gpu_uuid, "held" if a.released_at is None else "released")
        for a in detail.allocations
    ]
    return make_table(("REPLICA", "NODE", "GPU", "MODEL", "UUID", "STATUS"), rows, title="GPUs")


def _events(detail: WorkloadDetail) -> Table:
    """Return the workload's timeline, oldest first."""
    rows = [
        (
            e.created_at,
            e.kind,
            f"{e.from_state} → {e.to_state}" if e.from_state or e.to_state else "",
            e.reason_code,
            e.message,
        )
        for e in detail.events
    ]
    return make_table(("TIME", "EVENT", "STATE", "REASON", "MESSAGE"), rows, title="Events")
