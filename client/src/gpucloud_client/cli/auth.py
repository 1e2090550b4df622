"""Logging in and choosing where to act: `login`, `logout`, `contexts`, `use`, `whoami`.

A token is read from stdin or a prompt without echo, checked with `GET me/` before anything is saved,
and never printed: `contexts` leaves it out and `whoami` shows only its redacted prefix.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click

from gpucloud_client.cli.state import AppState

if TYPE_CHECKING:
    from gpucloud_client.config import Config, Context
    from gpucloud_client.models import Me

pass_state = click.make_pass_decorator(AppState, ensure=True)


@click.command()
@click.argument("url")
@click.option("--token-stdin", is_flag=True, help="Read the API token from stdin (else prompt without echo).")
@click.option("--name", metavar="NAME", help="Name of the context (default: the tenant, else the host).")
@click.option("--tenant", "tenant_opt", metavar="SLUG", help="Default tenant (default: the token's).")
@click.option("--project", "project_opt", metavar="SLUG", help="Default project for submissions.")
@pass_state
def login(
    state: AppState, url: str, token_stdin: bool, name: str | None, tenant_opt: str | None, project_opt: str | None
) -> None:
    """Log in to the console at URL with an API token and make it the current context.

    The token (create one on the console's "API tokens" page) is checked with the console before it is
    saved, with owner-only permissions, in the contexts file. Nothing is saved when the check fails.
    """
    from gpucloud_client.config import Context, normalize_url

    token = _read_token(token_stdin)
    state.secrets.append(token)
    base = normalize_url(url)
    probe = Context(name=name or "login", url=base, token=token, tenant=tenant_opt or state.tenant)
    me = state.client(probe).me()
    tenant = tenant_opt or state.tenant or _token_tenant(me)
    context = Context(
        name=name or _default_name(base, tenant),
        url=base,
        token=token,
        tenant=tenant,
        project=project_opt or state.project,
    )
    config = state.config()
    config.add(context)
    path = config.save()
    where = f" in tenant {tenant}" if tenant else ""
    click.echo(f"Logged in to {base} as {me.username}{where}; context {context.name!r} saved in {path}.", err=True)


def _read_token(from_stdin: bool) -> str:
    """Return the token from stdin's first line or a prompt without echo; raises UsageError when empty."""
    raw = sys.stdin.readline() if from_stdin else click.prompt("API token", hide_input=True, err=True)
    token = str(raw).strip()
    if not token:
        raise click.UsageError("no token given")
    return token


def _token_tenant(me: Me) -> str | None:
    """Return the tenant the token is bound to, else the caller's only tenant, else None."""
    if me.token is not None and me.token.tenant:
        return me.token.tenant
    return me.memberships[0].tenant if len(me.memberships) == 1 else None


def _default_name(url: str, tenant: str | None) -> str:
    """Return a context name: `<tenant>@<host>` (or the host alone), so two consoles never collide."""
    host = urlsplit(url).netloc
    return f"{tenant}@{host}" if tenant else host


@click.command()
@click.argument("name", required=False)
@pass_state
def logout(state: AppState, name: str | None) -> None:
    """Forget context NAME (default: the current one) and its token.

    The token itself stays valid on the console: revoke it there when it should stop working.
    """
    config = state.config()
    target = name or state.context_name or config.current
    if target is None:
        raise click.UsageError("no current context: name the context to forget")
    config.remove(target)
    config.save()
    after = f"; current context is now {config.current!r}" if config.current else ""
    click.echo(f"Forgot context {target!r}{after}.", err=True)


@click.command()
@pass_state
def contexts(state: AppState) -> None:
    """List the saved contexts; `*` marks the current one. Tokens are never shown."""
    from rich.text import Text

    from gpucloud_client.cli.output import emit, make_table

    config = state.config()
    rows = [_context_json(context, config) for _, context in sorted(config.contexts.items())]
    columns = ("CURRENT", "NAME", "URL", "TENANT", "PROJECT")
    table = [(Text("*" if r["current"] else ""), r["name"], r["url"], r["tenant"], r["project"]) for r in rows]
    emit(state.output, rows, lambda: make_table(columns, table))


def _context_json(context: Context, config: Config) -> dict[str, Any]:
    """Return what `contexts -o json` shows of a context: everything but the token."""
    return {
        "name": context.name,
        "url": context.url,
        "tenant": context.tenant,
        "project": context.project,
        "current": context.name == config.current,
    }


@click.command()
@click.argument("name")
@pass_state
def use(state: AppState, name: str) -> None:
    """Make context NAME the current one."""
    config = state.config()
    config.use(name)
    config.save()
    click.echo(f"Current context is now {name!r}.", err=True)


@click.command()
@pass_state
def whoami(state: AppState) -> None:
    """Show who the current context acts as: user, tenant, role and the token's (redacted) prefix."""
    from gpucloud_client.cli.output import emit, make_table
    from gpucloud_client.config import redact

    context = state.context()
    me = state.client().me()
    token = me.token
    rows = [
        ("Context", context.name),
        ("Console", context.url),
        ("User", f"{me.username} <{me.email}>" if me.email else me.username),
        ("Operator", me.is_operator),
        ("Tenant", context.tenant),
        ("Project", context.project),
        ("Token", f"{redact(context.token)} {token.name!r}" if token and token.name else redact(context.token)),
        ("Token role", token.role if token else None),
        ("Token expires", token.expires_at if token else None),
        ("Memberships", [f"{m.tenant} ({m.role})" for m in me.memberships]),
    ]
    emit(state.output, me.raw, lambda: make_table(("FIELD", "VALUE"), rows))


COMMANDS = [login, logout, contexts, use, whoami]
