"""`submit --wait`: follow submitted workloads until they end, and say what the shell should exit with.

State changes go to stderr as they happen. With `--logs` the (single) workload's log is printed on stdout
meanwhile, and is drained to its last line after the workload ended. The exit code is the workload's own
(errors.exit_code_for_workload); for several workloads, the first one's (in submission order) that is not
0, else 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from gpucloud_client.aclient import AsyncClient
    from gpucloud_client.cli.state import AppState
    from gpucloud_client.models import Workload, WorkloadDetail

    Submitted = tuple[str | None, Workload]

LOG_DRAIN_SECONDS = 10.0  # how long the log may keep arriving once the workload rests (hibernated: never ends)


def wait_for(state: AppState, submitted: list[Submitted], *, as_list: bool, with_logs: bool) -> int:
    """Return the exit code once every workload ended (or hibernated), following them as the module says.

    Raises UsageError for --logs with several workloads; KeyboardInterrupt after saying they keep running.
    """
    if with_logs and len(submitted) != 1:
        raise click.UsageError("--logs follows one workload; this file submitted several")
    try:
        finals = asyncio.run(_wait_all(state, submitted, with_logs))
    except KeyboardInterrupt:
        ids = " ".join(str(workload.id) for _, workload in submitted)
        click.echo(f"still running; `gpc cancel {ids}` stops them", err=True)
        raise
    _report(state, finals, as_list=as_list, logs_on_stdout=with_logs)
    return combined_exit_code(finals)


def combined_exit_code(finals: list[WorkloadDetail]) -> int:
    """Return the first non-zero exit code of the workloads (in order), else 0."""
    from gpucloud_client.errors import exit_code_for_workload

    codes = [exit_code_for_workload(detail.state, detail.exit_code) for detail in finals]
    return next((code for code in codes if code != 0), 0)


async def _wait_all(state: AppState, submitted: list[Submitted], with_logs: bool) -> list[WorkloadDetail]:
    """Wait for every workload at once (one events stream each); with logs, print the first one's too."""
    client = state.aclient()
    try:
        log_task = None
        if with_logs:
            tenant, workload = submitted[0]
            log_task = asyncio.create_task(print_log(client.for_tenant(tenant), workload.id))
        waits = [client.for_tenant(tenant).wait(w.id, on_change=StateReporter(w)) for tenant, w in submitted]
        finals = list(await asyncio.gather(*waits))
        if log_task is not None:
            await _drain(log_task)
        return finals
    finally:
        await client.aclose()


async def print_log(client: AsyncClient, workload_id: int) -> None:
    """Print the workload's whole log on stdout as it arrives (the library resumes dropped connections)."""
    out = sys.stdout
    async for line in client.follow_logs(workload_id, after=0):
        out.write(line.text + "\n")
        out.flush()


async def _drain(log_task: asyncio.Task[None]) -> None:
    """Let the log finish (it ends by itself once the workload ended); give up after LOG_DRAIN_SECONDS."""
    # A hibernated notebook's log never ends: wait_for cancels it after the grace.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(log_task, LOG_DRAIN_SECONDS)


class StateReporter:
    """`on_change` of a wait: prints `<id> <name>: <state> (<reason>)` on stderr when state or reason changed."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.seen: tuple[str, str] = (workload.state, workload.reason_code)

    def __call__(self, detail: WorkloadDetail) -> None:
        seen = (detail.state, detail.reason_code)
        if seen == self.seen:
            return
        self.seen = seen
        click.echo(describe_change(detail), err=True)


def describe_change(detail: WorkloadDetail) -> str:
    """Return the status line of a workload's new state: reason and queue position while it waits."""
    line = f"{detail.id} {detail.name}: {detail.state}"
    if detail.state in {"pending", "preempted"}:
        if detail.queue_position is not None:
            line += f" #{detail.queue_position} in queue"
        if detail.reason_message:
            line += f" ({detail.reason_message})"
    elif detail.ended and detail.exit_code is not None:
        line += f" (exit code {detail.exit_code})"
    elif detail.ended and detail.reason_message:
        line += f" ({detail.reason_message})"
    return line


def _report(state: AppState, finals: list[WorkloadDetail], *, as_list: bool, logs_on_stdout: bool) -> None:
    """Print the final workloads on stdout: objects (-o json|yaml; a list when `as_list`), or a table unless
    the log is there. Their last state change is already on stderr (the waits' `on_change`)."""
    from gpucloud_client.cli.output import emit
    from gpucloud_client.cli.views import workloads_brief

    if state.structured:
        data: Any = [d.raw for d in finals] if as_list else finals[0].raw
        emit(state.output, data, lambda: workloads_brief(finals))
    elif not logs_on_stdout:
        emit(state.output, None, lambda: workloads_brief(finals))
