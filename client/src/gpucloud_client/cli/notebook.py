"""`gpc notebook open`: wait for a notebook to answer, showing its launch steps, then print and open its URL.

The steps are drawn live on stderr as the console reports them (a spinner on the current one; `launch.py`);
stdout gets only the absolute URL, so `gpc notebook open 12 --no-browser` can feed a script.
"""

from __future__ import annotations

import os
import sys

import click

from gpucloud_client.cli.state import AppState

pass_state = click.make_pass_decorator(AppState, ensure=True)


@click.group()
def notebook() -> None:
    """Notebook sessions (start one with `gpc submit NAME --kind notebook --image ...`)."""


@notebook.command("open")
@click.argument("workload_id", metavar="ID", type=int)
@click.option("--no-browser", is_flag=True, help="Only print the URL; do not open a browser.")
@pass_state
def open_notebook(state: AppState, workload_id: int, no_browser: bool) -> None:
    """Wait until notebook ID answers (launch steps shown on stderr), print its URL and open it in a browser.

    A browser is opened only when there is one to open (a display, or $BROWSER) and not with --no-browser.
    Fails when the notebook has ended or hibernated (`gpc resume ID` queues it again) or is not a notebook.
    """
    import asyncio

    from gpucloud_client.cli.launch import until_ready

    detail = asyncio.run(until_ready(state, workload_id))
    url = f"{state.context().url.rstrip('/')}{detail.notebook_url}"
    click.echo(url)
    if not no_browser and can_open_browser():
        import webbrowser

        webbrowser.open(url)


def can_open_browser() -> bool:
    """Return whether a browser can be shown: macOS and Windows always, elsewhere with a display or $BROWSER."""
    if sys.platform in {"darwin", "win32"}:
        return True
    return any(os.environ.get(name) for name in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"))


COMMANDS = [notebook]
