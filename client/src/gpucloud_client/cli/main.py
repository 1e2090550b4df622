"""The `gpc` command: the click group, its global options, and how failures become messages and exit codes.

Start-up matters (`gpc --help` within 150 ms): this module and the command modules it registers import
only click and the standard library at module level. The library, httpx, websockets, yaml and rich are
imported inside the functions that need them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from gpucloud_client.cli import auth, logs, notebook, quota, top, volumes, workloads
from gpucloud_client.cli.state import OUTPUT_FORMATS, AppState

EXIT_INTERRUPTED = 130  # the library's errors.EXIT_INTERRUPTED, restated so --help need not import it
EXIT_BROKEN_PIPE = 141  # what a shell reports for a process killed by SIGPIPE (`gpc logs -f | head`)


class GpcGroup(click.Group):
    """A group that lists its commands in the order they were added and turns failures into exit codes."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Return the commands in registration order (related commands sit together in --help)."""
        return list(self.commands)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a ClientError is printed as `error: ...` and exits with its code, Ctrl-C with 130."""
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
        except Exception as exc:
            code = _report(ctx, exc)
            if code is None:
                raise
            raise click.exceptions.Exit(code) from None


def _report(ctx: click.Context, exc: Exception) -> int | None:
    """Print `exc` when it is a ClientError and return its exit code; None for anything else (a bug)."""
    from gpucloud_client.errors import ClientError

    if not isinstance(exc, ClientError):
        return None
    from gpucloud_client.cli.output import print_error

    state = ctx.find_object(AppState)
    print_error(exc, secrets=state.secrets if state else [])
    return exc.exit_code


@click.group(cls=GpcGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--context", "context_name", metavar="NAME", help="Use this login context (default: the current one).")
@click.option(
    "-o",
    "--output",
    type=click.Choice(OUTPUT_FORMATS),
    default="table",
    show_default=True,
    help="Tables for people; json or yaml prints the API's objects exactly.",
)
@click.option("--tenant", metavar="SLUG", help="Act in this tenant (default: the context's).")
@click.option("--project", metavar="SLUG", help="Default project (default: the context's).")
@click.version_option(package_name="gpucloud-client", prog_name="gpc")
@click.pass_context
def cli(ctx: click.Context, context_name: str | None, output: str, tenant: str | None, project: str | None) -> None:
    """gpc: submit and watch GPU workloads on a gpucloud console.

    Start with `gpc login URL`. Exit codes: 0 ok, 1 failed, 2 usage, 3 invalid, 4 auth, 5 not found,
    6 conflict, 7 unavailable, 8 cancelled, 9 lost, 130 interrupted (docs/cli.md).
    """
    state = ctx.ensure_object(AppState)
    state.context_name = context_name or state.context_name
    state.output = output
    state.tenant = tenant or state.tenant
    state.project = project or state.project


for _module in (auth, workloads, logs, notebook, top, quota, volumes):
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Run `gpc` and exit: Ctrl-C anywhere (a prompt too) exits 130, a closed pipe quietly with 141."""
    try:
        code = cli.main(args=argv, prog_name="gpc", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        code = EXIT_INTERRUPTED
    except click.exceptions.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except BrokenPipeError:
        # Python would complain again flushing stdout at exit: point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_BROKEN_PIPE
    sys.exit(code if isinstance(code, int) else 0)
