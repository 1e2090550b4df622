"""How `gpc notebook open` waits: the launch steps drawn live on stderr until the notebook answers."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from rich.console import RenderableType
    from rich.live import Live

    from gpucloud_client.aclient import AsyncClient
    from gpucloud_client.cli.state import AppState
    from gpucloud_client.models import WorkloadDetail

REREAD_SECONDS = 1.0  # how often the workload is read again while the events stream says nothing


async def until_ready(state: AppState, workload_id: int) -> WorkloadDetail:
    """Return the notebook's detail once it has a URL, showing its launch steps on stderr meanwhile.

    Raises ClientError when it never will have one (not a notebook, ended, hibernated).
    """
    client = state.aclient()
    try:
        detail = await client.workload(workload_id)
        check_openable(detail)
        if detail.notebook_url:
            return detail
        return await _follow_steps(client, detail)
    finally:
        await client.aclose()


def check_openable(detail: WorkloadDetail) -> None:
    """Raise ClientError unless `detail` is a notebook that is, or is getting, ready to open."""
    from gpucloud_client.errors import EXIT_CONFLICT, EXIT_INVALID, ClientError

    if detail.kind != "notebook":
        raise ClientError(f"workload {detail.id} is a {detail.kind}, not a notebook", exit_code=EXIT_INVALID)
    if detail.state == "hibernated":
        message = f"notebook {detail.id} is hibernated: `gpc resume {detail.id}` starts it again"
        raise ClientError(message, exit_code=EXIT_CONFLICT)
    if detail.ended:
        reason = f" ({detail.reason_message})" if detail.reason_message else ""
        raise ClientError(f"notebook {detail.id} has {detail.state}{reason}", exit_code=EXIT_CONFLICT)


async def _follow_steps(client: AsyncClient, detail: WorkloadDetail) -> WorkloadDetail:
    """Show the launch steps live on stderr, reading the workload on every event about it, until it answers.

    Falls back to reading it every second when the events stream cannot be had.
    """
    from rich.live import Live

    from gpucloud_client.cli.output import console
    from gpucloud_client.streams import WaitWatch, aiterate

    watch = WaitWatch(client.tenant, detail.project, detail.id)
    signals = aiterate(client.context, watch, idle_timeout=REREAD_SECONDS)
    with Live(_progress(detail), console=console(stderr=True), refresh_per_second=8) as live:
        try:
            while await _next_signal(signals):
                detail = await _reread(client, detail, live)
                if detail.notebook_url:
                    return detail
        finally:
            await signals.aclose()
        while not detail.notebook_url:
            await asyncio.sleep(REREAD_SECONDS)
            detail = await _reread(client, detail, live)
        return detail


async def _reread(client: AsyncClient, detail: WorkloadDetail, live: Live) -> WorkloadDetail:
    """Return the workload read again, drawn; raises ClientError once it can no longer be opened."""
    fresh = await client.workload(detail.id)
    live.update(_progress(fresh))
    if not fresh.notebook_url:
        check_openable(fresh)
    return fresh


async def _next_signal(signals: AsyncIterator[object]) -> bool:
    """Return whether the events stream gave another signal (False once it failed for good or ended)."""
    from gpucloud_client.errors import ClientError

    try:
        await anext(signals)
    except (StopAsyncIteration, ClientError):
        return False
    return True


def _progress(detail: WorkloadDetail) -> RenderableType:
    """Return the notebook's name, state and reason above its launch steps (the current one spinning)."""
    from rich.console import Group
    from rich.text import Text

    from gpucloud_client.cli.views import launch_steps_table, state_text

    head = Text.assemble(f"notebook {detail.id} {detail.name}: ", state_text(detail.state))
    if detail.reason_message and detail.state in {"pending", "preempted"}:
        head.append(f" ({detail.reason_message})", style="dim")
    # Once Jupyter answers nothing is under way any more: the last frame shows every step done, no spinner.
    return Group(head, launch_steps_table(detail.launch_steps, spinner=not detail.notebook_url))
