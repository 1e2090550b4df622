"""Workloads: `ls` (and `ls --watch`), `describe`, and the actions `cancel`, `restart`, `extend`, `hibernate`,
`resume`. Submitting is in `submit.py`, following a workload's log in `logs.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpucloud_client.cli.state import AppState
from gpucloud_client.cli.submit import submit

if TYPE_CHECKING:
    from rich.table import Table

    from gpucloud_client.client import Client
    from gpucloud_client.models import Workload

pass_state = click.make_pass_decorator(AppState, ensure=True)

STATES = ("pending", "scheduled", "starting", "running", "preempted", "hibernated", "succeeded", "failed")
STATES_ALL = (*STATES, "cancelled", "lost")
# What `ls` shows without --all or --state: every workload that has not ended.
NOT_ENDED = ("pending", "scheduled", "starting", "running", "preempted", "hibernated")


@click.command("ls")
@click.option("--state", "state_filter", type=click.Choice(STATES_ALL), help="Only workloads in this state.")
@click.option("--kind", type=click.Choice(("job", "notebook")), help="Only jobs or only notebooks.")
@click.option("--project", "project_opt", metavar="SLUG", help="Only this project's workloads.")
@click.option("--pool", metavar="NAME", help="Only workloads in this node pool.")
@click.option("--mine", is_flag=True, help="Only your own workloads.")
@click.option("--all", "show_all", is_flag=True, help="Ended workloads too (default: those not ended).")
@click.option("--watch", "-w", is_flag=True, help="Keep the table live from the events stream (q or Ctrl-C quits).")
@pass_state
def ls(
    state: AppState,
    state_filter: str | None,
    kind: str | None,
    project_opt: str | None,
    pool: str | None,
    mine: bool,
    show_all: bool,
    watch: bool,
) -> None:
    """List workloads, newest first: by default those that have not ended.

    With --watch the table follows the console's events stream (states, reasons and queue positions
    change in place) until q or Ctrl-C; with -o json|yaml it prints one object per change instead.
    """
    filters = ListFilters(
        state=state_filter,
        kind=kind,
        project=project_opt,
        pool=pool,
        show_all=show_all,
    )
    client = state.client()
    if mine:
        filters.owner = client.me().username
    found = list_workloads(client, filters)
    if watch:
        from gpucloud_client.cli.watch import watch_workloads

        watch_workloads(state, found, filters)
        return
    from gpucloud_client.cli.output import emit

    emit(state.output, [w.raw for w in found], lambda: workloads_table(found))


class ListFilters:
    """What `ls` asks for: the API's filters, and whether ended workloads count."""

    def __init__(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        project: str | None = None,
        pool: str | None = None,
        owner: str | None = None,
        show_all: bool = False,
    ) -> None:
        self.state, self.kind, self.project, self.pool = state, kind, project, pool
        self.owner, self.show_all = owner, show_all

    def states(self) -> tuple[str | None, ...]:
        """Return the states to ask the API for, one request each (None: no state filter)."""
        if self.state:
            return (self.state,)
        return (None,) if self.show_all else NOT_ENDED


def list_workloads(client: Client, filters: ListFilters) -> list[Workload]:
    """Return the workloads `filters` select, newest first (one request per state asked for)."""
    found: dict[int, Workload] = {}
    for one_state in filters.states():
        for workload in client.workloads(
            state=one_state, kind=filters.kind, project=filters.project, owner=filters.owner, pool=filters.pool
        ):
            found[workload.id] = workload
    return sorted(found.values(), key=lambda w: w.id, reverse=True)


def workloads_table(found: list[Workload]) -> Table:
    """Return the `ls` table: one row per workload."""
    from gpucloud_client.cli.output import ago, make_table, until
    from gpucloud_client.cli.views import gpus_text, state_text

    # ETA: when waiting work is expected to start (the scheduler's estimate; `describe` says what it rests on).
    columns = ("ID", "NAME", "KIND", "PROJECT", "OWNER", "STATE", "GPUS", "QUEUE", "ETA", "REASON", "AGE")
    rows = [
        (
            w.id,
            w.name,
            w.kind,
            w.project,
            w.owner,
            state_text(w.state),
            gpus_text(w.gpus_per_replica, w.replicas),
            w.queue_position,
            until(w.estimated_start_at) if w.state == "pending" else None,
            w.reason_code,
            ago(w.submitted_at),
        )
        for w in found
    ]
    return make_table(columns, rows)


@click.command()
@click.argument("workload_id", metavar="ID", type=int)
@pass_state
def describe(state: AppState, workload_id: int) -> None:
    """Show one workload: state, why it waits (reason, hint, queue position), its GPUs, launch steps and events."""
    from gpucloud_client.cli.describe import describe_view
    from gpucloud_client.cli.output import emit

    detail = state.client().workload(workload_id)
    emit(state.output, detail.raw, lambda: describe_view(detail, state.context().url))


def _action(name: str, verb: str, help_text: str) -> click.Command:
    """Return the command that POSTs action `name` to each workload ID given and prints what it answers."""

    @click.command(name, help=help_text)
    @click.argument("workload_ids", metavar="ID...", type=int, nargs=-1, required=True)
    @pass_state
    def command(state: AppState, workload_ids: tuple[int, ...]) -> None:
        run_action(state, name, verb, workload_ids)

    return command


def run_action(state: AppState, name: str, verb: str, workload_ids: tuple[int, ...]) -> None:
    """POST action `name` to every workload in turn, reporting each failure as it comes.

    Every workload gets its request even when one fails; the exit code is then the last failure's.
    """
    from gpucloud_client.cli.output import emit, print_error, status
    from gpucloud_client.cli.views import workloads_brief
    from gpucloud_client.errors import ClientError

    done: list[Workload] = []
    code = 0
    with state.client() as client:
        for workload_id in workload_ids:
            try:
                workload = _call(client, name, workload_id)
            except ClientError as error:
                status(f"{workload_id}: not {verb}")
                print_error(error, secrets=state.secrets)
                code = error.exit_code
                continue
            done.append(workload)
            status(f"{verb} {workload.id} ({workload.name}): now {workload.state}")
    if done:
        data = [w.raw for w in done] if len(workload_ids) > 1 else done[0].raw
        emit(state.output, data, lambda: workloads_brief(done))
    if code:
        raise click.exceptions.Exit(code)


def _call(client: Client, name: str, workload_id: int) -> Workload:
    """Return what `client.<name>(workload_id)` answers (cancel, restart, extend, hibernate, resume)."""
    method = getattr(client, name)
    result: Workload = method(workload_id)
    return result


cancel = _action(
    "cancel",
    "cancelled",
    "Cancel workloads: a pending one never starts, a running one is stopped (SIGTERM, grace, SIGKILL).",
)
restart = _action("restart", "restarted", "Queue ended workloads again as a new attempt.")
extend = _action("extend", "extended", "Keep idle-warned notebooks running (once per session).")
hibernate = _action("hibernate", "hibernated", "Stop notebooks, keeping their files; `gpc resume` queues them again.")
resume = _action("resume", "resumed", "Queue hibernated notebooks again with the same settings.")

COMMANDS = [submit, ls, describe, cancel, restart, extend, hibernate, resume]
