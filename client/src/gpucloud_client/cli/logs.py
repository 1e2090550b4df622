"""`gpc logs`: a workload's log, printed as it is, or followed live (`-f`) until the workload ends.

Following is the library's `follow_logs`: it resumes a dropped connection after the last line it yielded,
so no line is lost or printed twice; this module only prints. Lines go to stdout, unbuffered per batch
of what has arrived, so `gpc logs -f ID | grep` sees them at once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, TextIO

import click

from gpucloud_client.cli.state import AppState

if TYPE_CHECKING:
    from gpucloud_client.client import Client
    from gpucloud_client.models import LogLine

pass_state = click.make_pass_decorator(AppState, ensure=True)
PAGE = 5000  # the API's largest log page


@click.command()
@click.argument("workload_id", metavar="ID", type=int)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the workload ends.")
@click.option("--tail", type=click.IntRange(0, 5000), metavar="N", help="Start with the last N lines.")
@click.option("--since", type=click.IntRange(0), metavar="SEQ", help="Only the lines after line number SEQ.")
@click.option("--timestamps", "-t", is_flag=True, help="Prefix each line with its time.")
@pass_state
def logs(
    state: AppState, workload_id: int, follow: bool, tail: int | None, since: int | None, timestamps: bool
) -> None:
    """Print workload ID's log (stdout and stderr of every replica and attempt, in order).

    Without options the whole log; --tail N the last N lines; --since SEQ the lines after SEQ. With -f it
    then follows the log live, across dropped connections without gaps or repeats, until the workload
    ends. -o json prints one JSON object per line ({seq, timestamp, stream, text, attempt, replica}).
    """
    if tail is not None and since is not None:
        raise click.UsageError("--tail and --since cannot be combined")
    printer = LinePrinter(sys.stdout, state.output, timestamps=timestamps)
    with state.client() as client:
        if follow:
            start = since if since is not None else (None if tail is not None else 0)
            printer.print_all(client.follow_logs(workload_id, after=start, tail=tail))
        elif tail is not None:
            printer.print_all(client.logs(workload_id, limit=tail).lines if tail else [])
        else:
            printer.print_all(read_all(client, workload_id, since or 0))


def read_all(client: Client, workload_id: int, since: int) -> Iterable[LogLine]:
    """Yield every stored line after `since`, page after page, until the API says the log is complete."""
    while True:
        page = client.logs(workload_id, since=since, limit=PAGE)
        yield from page.lines
        if page.complete or not page.lines:
            return
        since = page.next_since


class LinePrinter:
    """Prints log lines as text (optionally timestamped) or as JSON objects; one flush per line written."""

    def __init__(self, out: TextIO, fmt: str, *, timestamps: bool = False) -> None:
        self.out, self.fmt, self.timestamps = out, fmt, timestamps

    def format(self, line: LogLine) -> str:
        """Return how `line` is printed (without the newline)."""
        if self.fmt == "json":
            return json.dumps(line.raw, ensure_ascii=False, separators=(",", ":"))
        if self.fmt == "yaml":
            from gpucloud_client.cli.output import dump

            return "---\n" + dump(line.raw, "yaml")
        return f"{line.timestamp} {line.text}" if self.timestamps else line.text

    def print_all(self, lines: Iterable[LogLine]) -> int:
        """Print every line as it comes; return how many were printed."""
        count = 0
        for line in lines:
            self.out.write(self.format(line) + "\n")
            self.out.flush()
            count += 1
        return count


COMMANDS = [logs]
