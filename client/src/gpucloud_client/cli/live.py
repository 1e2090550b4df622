"""Live full-terminal displays (`ls --watch`, `top`): redraw with rich's Live, quit on q or Ctrl-C.

The display runs on asyncio: producer tasks (the WebSocket streams) update a model and set `changed`;
the loop redraws on every change, and at least every `interval` seconds (ages and rates keep moving).
Keys are read from the terminal in cbreak mode (no echo, no line buffering, Ctrl-C still a signal), and
whatever happens, the terminal is put back as it was: its mode, the cursor, and the main screen.
Works in any terminal that speaks ANSI, tmux and screen included.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import RenderableType

QUIT_KEYS = frozenset(b"qQ\x03\x1b")  # q, Q, a literal Ctrl-C byte, Esc


@contextlib.contextmanager
def quit_keys(loop: asyncio.AbstractEventLoop, quit_event: asyncio.Event) -> Iterator[None]:
    """Set `quit_event` when q (or Esc) is pressed on the terminal, while inside the block.

    Does nothing when stdin is not a terminal (a pipe, a test runner): Ctrl-C still quits there. Puts the
    terminal's mode back on the way out, whatever happened inside.
    """
    fd = _terminal_fd()
    if fd is None:
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)

    def on_key() -> None:
        try:
            data = os.read(fd, 64)
        except OSError:
            data = b"q"  # the terminal went away: nothing left to draw on
        if not data or QUIT_KEYS.intersection(data):
            quit_event.set()

    try:
        tty.setcbreak(fd)
        loop.add_reader(fd, on_key)
        yield
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _terminal_fd() -> int | None:
    """Return stdin's descriptor when it is a terminal this process may read keys from, else None."""
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return fd if os.name == "posix" and os.isatty(fd) else None


async def run_live(
    render: Callable[[], RenderableType],
    producers: list[Coroutine[Any, Any, None]],
    changed: asyncio.Event,
    *,
    interval: float = 1.0,
    screen: bool = False,
) -> None:
    """Show `render()` live until q, Ctrl-C (KeyboardInterrupt propagates) or every producer has finished.

    Producers run as tasks and set `changed` when the model changed; a producer's exception ends the
    display and is raised (after the terminal is restored). `screen` uses the alternate screen (like
    top): the terminal's content comes back on quit. Without it the last frame stays on the terminal.
    """
    from rich.live import Live

    from gpucloud_client.cli.output import console

    loop = asyncio.get_running_loop()
    quit_event = asyncio.Event()
    tasks = [asyncio.ensure_future(producer) for producer in producers]
    live = Live(render(), console=console(), screen=screen, auto_refresh=False, redirect_stderr=False)
    try:
        with live, quit_keys(loop, quit_event):
            while not quit_event.is_set() and not all(task.done() for task in tasks):
                _raise_failed(tasks)
                await _next_change(changed, quit_event, interval)
                live.update(render(), refresh=True)
            _raise_failed(tasks)
    finally:
        await _cancel(tasks)


async def _next_change(changed: asyncio.Event, quit_event: asyncio.Event, interval: float) -> None:
    """Return when the model changed, quit was asked, or `interval` passed; clears `changed`."""
    waiters = [asyncio.ensure_future(changed.wait()), asyncio.ensure_future(quit_event.wait())]
    try:
        await asyncio.wait(waiters, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    changed.clear()


def _raise_failed(tasks: Sequence[asyncio.Future[None]]) -> None:
    """Raise the exception of the first producer that failed (a stream closed for good, a lost login)."""
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]  # checked not None just above


async def _cancel(tasks: Sequence[asyncio.Future[None]]) -> None:
    """Cancel the producers and wait for them: their streams close their connections on the way out."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
