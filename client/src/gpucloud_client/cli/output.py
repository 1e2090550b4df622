"""How `gpc` prints: tables for people on stdout, messages on stderr, exact API objects for scripts.

`-o json` and `-o yaml` print the objects exactly as the API sent them (the models' `raw`); tables are
rich tables on stdout; progress and status lines go to stderr so that stdout stays parseable. Nothing
printed through here may contain a token: error messages are scrubbed of every token this run knows.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

    from gpucloud_client.errors import ClientError

# Columns a table falls back to when stdout is not a terminal (a pipe into grep must not wrap at 80).
_PIPE_WIDTH = 200


def console(*, stderr: bool = False) -> Console:
    """Return a rich console on stdout (or stderr); plain under NO_COLOR.

    On a terminal its size is the terminal's own, read again at every render (a resize, a tmux pane):
    a COLUMNS or LINES inherited from elsewhere would make a live display wrap. Not on a terminal, it is
    COLUMNS wide, else 200 columns.
    """
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        environ = {k: v for k, v in os.environ.items() if k not in {"COLUMNS", "LINES"}}
        return Console(file=stream, highlight=False, soft_wrap=False, _environ=environ)
    width = int(os.environ.get("COLUMNS") or _PIPE_WIDTH)
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def dump(data: Any, fmt: str) -> str:
    """Return `data` as `fmt` ("json" or "yaml") text: keys in the API's order, nothing added or dropped."""
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False)
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False).rstrip("\n")


def emit(fmt: str, data: Any, table: Callable[[], RenderableType]) -> None:
    """Print `data` (API objects) as `fmt`, or for "table" the renderable `table()` builds (only then built)."""
    if fmt == "table":
        console().print(table())
    else:
        click.echo(dump(data, fmt))


def emit_record(fmt: str, data: Any) -> None:
    """Print one object of a stream for scripts: a JSON line, or a YAML document opened by `---`."""
    if fmt == "json":
        click.echo(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    else:
        click.echo("---\n" + dump(data, "yaml"))


def make_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None) -> Table:
    """Return a borderless table with bold headers: `columns` as headers, each row's cells as text."""
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False, title=title, title_justify="left")
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(cell if _is_renderable(cell) else text(cell) for cell in row))
    return table


def _is_renderable(cell: Any) -> bool:
    from rich.text import Text

    return isinstance(cell, Text)


def text(value: Any) -> str:
    """Return a cell's text: `-` for None or empty, lists comma-joined, booleans as yes/no."""
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def _moment(stamp: str) -> datetime | None:
    """Return an RFC 3339 time as an aware datetime (UTC when it names no zone); None when it does not parse."""
    try:
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def ago(stamp: str | None, *, now: datetime | None = None) -> str:
    """Return an RFC 3339 time as people read it in a table ("5s", "3m", "2h", "4d"); `-` for None."""
    if not stamp:
        return "-"
    moment = _moment(stamp)
    if moment is None:
        return stamp
    seconds = max(0, int(((now or datetime.now(UTC)) - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def until(stamp: str | None, *, now: datetime | None = None) -> str:
    """Return how far ahead an RFC 3339 time is, as people read it in a table ("~5m", "~2h", "~4d"; "now" within
    a minute or past); `-` for None."""
    if not stamp:
        return "-"
    moment = _moment(stamp)
    if moment is None:
        return stamp
    seconds = int((moment - (now or datetime.now(UTC))).total_seconds())
    if seconds < 60:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"~{round(seconds / size)}{unit}"
    return "now"


def size(value: int | float | None) -> str:
    """Return a byte count in binary units ("1.5 GiB"); `-` for None."""
    if value is None:
        return "-"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(amount) < 1024 or unit == "TiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TiB"  # pragma: no cover - the loop always returns


def status(message: str) -> None:
    """Print a progress or status line for people on stderr (never on stdout, which scripts read)."""
    click.echo(message, err=True)


def error_lines(exc: ClientError, *, secrets: Sequence[str] = ()) -> list[str]:
    """Return how `exc` reads on stderr: `error: <message>`, then one indented line per field or spec issue.

    A field line is `  <field>: <rule code>: <message>`; a spec issue's is prefixed with its place,
    `  spec.yaml:7 (document 2) <field>: <rule code>: <message>`. A server error adds its request id.
    Every token in `secrets` is replaced by its redacted form wherever it appears.
    """
    from gpucloud_client.errors import ApiError, SpecError

    lines = [f"error: {exc.message}"]
    if isinstance(exc, ApiError):
        lines += [f"  {line}" for line in exc.field_lines()]
        if exc.status >= 500 and exc.request_id:
            lines.append(f"  (request id {exc.request_id}: quote it to the console's operators)")
    elif isinstance(exc, SpecError):
        lines += [f"  {issue.format()}" for issue in exc.issues]
    return [scrub(line, secrets) for line in lines]


def scrub(line: str, secrets: Sequence[str]) -> str:
    """Return `line` with every (non-empty) secret replaced by its redacted form."""
    from gpucloud_client.config import redact

    for secret in secrets:
        if secret and secret in line:
            line = line.replace(secret, redact(secret))
    return line


def print_error(exc: ClientError, *, secrets: Sequence[str] = ()) -> None:
    """Print `exc` on stderr as `error_lines` words it."""
    for line in error_lines(exc, secrets=secrets):
        click.echo(line, err=True)
