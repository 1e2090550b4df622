"""The `gpucloud` command.

gpucloud up              migrate, collect static files, create the first operator, register
                         this machine as node `local` (first start), and serve the console
                         with its workers in one process; --demo adds the simulated demo fleet
gpucloud demo            add the simulated demo fleet (nodes, pool, tenant, queued jobs) to the database
gpucloud serve           serve the web process only (distributed deployments)
gpucloud worker          run a Celery worker (controller), optionally with beat
gpucloud agent --node N  run the agent of node N: its queue, heartbeat and GPU sampler
gpucloud agent join URL TOKEN
                         join a GPU host to the console at URL with a one-time token, store the
                         node's credential, and run its agent (over HTTPS only: no broker, no database)
gpucloud agent run       run that agent again from the stored credential (after a reboot)
gpucloud migrate         apply database migrations
gpucloud createoperator  create a platform operator account
gpucloud manage ...      any Django management command
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.banner import SignIn

if TYPE_CHECKING:
    from tenants.context import Actor

ROOT = Path(__file__).resolve().parents[1]


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
    import django

    django.setup()


def _serve(host: str, port: int) -> None:
    import uvicorn

    from gpucloud.embedded import notebook_socket
    from gpucloud.serving import server_config

    config = server_config("gpucloud.asgi:application", host=host, port=port, lifespan="off", log_level="info")
    # Notebooks have an origin of their own; on one machine, the next port, served by this same process.
    notebooks = notebook_socket(host, port)
    sockets = None if notebooks is None else [config.bind_socket(), notebooks]
    # Ctrl+C is how a console in a terminal is stopped: uvicorn already says it shut down, no traceback.
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run(sockets=sockets)


def _notebooks_next_door(host: str, port: int) -> None:
    """Default NOTEBOOK_ORIGIN to the next port on loopback for a console on loopback (before Django reads it)."""
    from gpucloud.embedded import default_notebook_origin
    from gpucloud.env import env_list

    default = default_notebook_origin(host, port, env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"]))
    if default is not None:
        os.environ.setdefault("NOTEBOOK_ORIGIN", default)


def _say(message: str) -> None:
    """Print one line of progress at once (the console's log follows; nothing is buffered)."""
    print(message, flush=True)


def _ensure_first_operator() -> SignIn:
    """Create the first operator when no operator exists; return who signs in (with a password generated now)."""
    from django.contrib.auth.models import User

    from tenants.context import SYSTEM
    from tenants.services import create_operator

    username = os.environ.get("GPUCLOUD_ADMIN_USERNAME") or "admin"
    password = os.environ.get("GPUCLOUD_ADMIN_PASSWORD") or ""
    existing = User.objects.filter(is_staff=True, is_active=True).order_by("pk").first()
    if existing is not None:
        return SignIn(existing.get_username(), from_environment=bool(password) and existing.username == username)
    generated = not password
    if generated:
        password = secrets.token_urlsafe(18)
    create_operator(actor=SYSTEM, username=username, password=password)
    return SignIn(username, password=password if generated else None, from_environment=not generated, created=True)


def _operator() -> Actor:
    """Return the first active operator as the actor of what the command line sets up; exits when there is none."""
    from django.contrib.auth.models import User

    from tenants.context import Actor

    user = User.objects.filter(is_staff=True, is_active=True).order_by("pk").first()
    if user is None:
        raise SystemExit("No operator yet: start the console once (gpucloud up) or run gpucloud createoperator NAME.")
    return Actor(user=user)


def _prepare_database() -> None:
    """Apply migrations and collect static files, saying so when there is work (the first start takes seconds)."""
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    started = time.monotonic()
    if pending:
        _say(f"Preparing the database: {len(pending)} migrations ...")
    call_command("migrate", interactive=False, verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)
    if pending:
        _say(f"  database ready in {time.monotonic() - started:.0f} s")


def _reconcile_now() -> None:
    """Ask for a reconcile at once: after a restart, work the broker lost is launched or released now."""
    from common import control
    from common.protocol.messages import Reconcile

    try:
        control.request(Reconcile.TASK)
    except OSError:
        print("Could not reach the broker to reconcile now; the periodic reconcile will.", file=sys.stderr)


def cmd_up(args: argparse.Namespace) -> None:
    """Run the whole console in one process: the embedded default."""
    _notebooks_next_door(args.host, args.port)
    _setup_django()
    from django.conf import settings

    from gpucloud import banner

    _prepare_database()
    sign_in = _ensure_first_operator()
    this_machine, demo = "", "not added; `gpucloud demo` (or the button on Operate → Cluster) adds simulated GPUs"
    if settings.EMBEDDED:
        this_machine = _start_embedded()
    if args.demo:
        demo = _add_demo()
    warnings = _address_warnings(args.host)
    url = banner.console_url(args.host, args.port)
    notebooks = str(settings.NOTEBOOK_ORIGIN or "")
    _say(
        banner.render(
            url=url, sign_in=sign_in, this_machine=this_machine, demo=demo, warnings=warnings, notebooks=notebooks
        )
    )
    _serve(args.host, args.port)


def _start_embedded() -> str:
    """Start the workers, beat and this machine's agent in this process; return what this machine serves as."""
    from django.conf import settings

    from gpucloud import embedded, local_node
    from gpucloud.celery import app
    from inventory.agent.config import config_from_settings
    from inventory.agent.runner import start_reporter
    from inventory.models import agent_queue_for

    plan = local_node.plan(root=ROOT, say=_say)
    # The agent of this machine's node runs here too, on its own queue.
    agent = config_from_settings(process_enabled=local_node.process_enabled(plan))
    embedded.start_workers(app, agent_queue=agent_queue_for(agent.node))
    embedded.start_beat(app, schedule_file=settings.DATA_DIR / "celerybeat-schedule")
    _reconcile_now()
    start_reporter(agent)
    return local_node.register(plan, actor=_operator(), node=agent.node)


def _add_demo() -> str:
    from jobs.services.demo import add_demo_fleet

    _say("Adding the simulated demo fleet ...")
    return add_demo_fleet(actor=_operator()).summary()


def _address_warnings(host: str) -> list[str]:
    """Say what a console bound beyond loopback still needs before other machines can use it."""
    from django.conf import settings

    from gpucloud.env import loopback_only

    if loopback_only([host]) or not loopback_only(settings.ALLOWED_HOSTS):
        return []
    return [
        f"listening on {host}, but ALLOWED_HOSTS names loopback only: set ALLOWED_HOSTS to the name other machines "
        "type (and GPUCLOUD_HTTPS=0 over plain HTTP); see docs/deploy.md"
    ]


def cmd_demo(args: argparse.Namespace) -> None:
    """Add the simulated demo fleet to the console's database (a running console schedules it at once)."""
    _setup_django()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    _say(_add_demo())


def cmd_serve(args: argparse.Namespace) -> None:
    _notebooks_next_door(args.host, args.port)
    _setup_django()
    _serve(args.host, args.port)


def cmd_worker(args: argparse.Namespace) -> None:
    _setup_django()
    from django.conf import settings

    from gpucloud.celery import app

    # Two workers on one host must not share Celery's default name (celery@host): remote control, the
    # unacknowledged-message recovery and the logs tell workers apart by it.
    hostname = args.hostname or f"{args.queues.replace(',', '+')}.{os.getpid()}@%h"
    argv = ["worker", "--loglevel", args.loglevel, "--queues", args.queues, "--hostname", hostname]
    if args.beat:
        # Beat's schedule lives with the rest of the data, not in whatever directory the worker started from.
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        argv += ["--beat", "--schedule", str(settings.DATA_DIR / "celerybeat-schedule")]
        _reconcile_now()
    app.worker_main(argv)


def cmd_agent(args: argparse.Namespace) -> None:
    """Run a node agent: a Celery worker on the node's queue plus the heartbeat and GPU sampler thread."""
    _setup_django()
    from gpucloud.celery import app
    from inventory.agent.config import config_from_settings
    from inventory.agent.runner import start_reporter, worker_argv

    overrides: dict[str, object] = {"probe": args.probe, "simulated_gpu_count": args.simulated_gpus}
    if args.allow_process_runtime:
        overrides["process_enabled"] = True
    config = config_from_settings(args.node, **overrides)
    start_reporter(config)
    app.worker_main(worker_argv(config, loglevel=args.loglevel))


def cmd_remote_agent(argv: Sequence[str]) -> None:
    """`gpucloud agent join|run`: the agent of a GPU host that reaches the console over HTTP(S) only."""
    args = _remote_agent_parser().parse_args(argv)
    # Before the settings load: the agent is given none of the console's secrets (gpucloud/settings.py).
    os.environ["GPUCLOUD_ROLE"] = "agent"
    _setup_django()
    import logging

    from inventory.agent.remote import RemoteAgentError

    logging.getLogger().setLevel(args.loglevel)
    try:
        _remote_agent(args)
    except RemoteAgentError as error:
        raise SystemExit(f"gpucloud agent {args.action}: {error}") from None


def _remote_agent(args: argparse.Namespace) -> None:
    from inventory.agent.remote.agent import RemoteOptions, run_remote_agent
    from inventory.agent.remote.credential import default_credential_path, default_work_dir, load_credential
    from inventory.agent.remote.join import join_console

    path = Path(args.credential_file).expanduser() if args.credential_file else default_credential_path()
    if args.action == "join":
        credential = join_console(
            args.console_url,
            _join_token(args.token),
            path=path,
            ca_file=args.ca_file,
            allow_http=args.allow_http,
            force=args.force,
        )
        _say(f"Joined {credential.console} as node {credential.node}; its credential is in {path}.")
        if args.no_run:
            return
    else:
        credential = load_credential(path)
    options = RemoteOptions(
        work_dir=Path(args.work_dir).expanduser() if args.work_dir else default_work_dir(path, credential.node),
        probe=args.probe,
        simulated_gpus=args.simulated_gpus,
        process_enabled=True if args.allow_process_runtime else None,
        ca_file=args.ca_file if args.action == "run" else None,
        allow_http=args.allow_http,
        spool_max_bytes=args.spool_max_mb * 1024 * 1024,
    )
    run_remote_agent(credential, options)


def _join_token(given: str) -> str:
    """Return the join token; `-` reads it from stdin, which keeps it out of the process list and shell history."""
    return sys.stdin.readline().strip() if given == "-" else given


def _remote_agent_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpucloud agent",
        description="The agent of a GPU host that reaches the console over HTTPS with a credential of its own "
        "(no SECRET_KEY, database or Redis on the host). `gpucloud agent --node N` runs the co-located agent.",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    join = actions.add_parser("join", help="join the console with a one-time token, store the credential, and run")
    join.add_argument("console_url", help="the console's URL, e.g. https://gpucloud.example.com")
    join.add_argument("token", help="the one-time join token an operator made for this host (- reads it from stdin)")
    join.add_argument("--force", action="store_true", help="replace an existing credential file")
    join.add_argument("--no-run", action="store_true", help="store the credential and exit (run later: agent run)")
    run = actions.add_parser("run", help="run the agent from the stored credential")
    for sub in (join, run):
        sub.add_argument(
            "--credential-file",
            help="where the credential is kept (default: /var/lib/gpucloud/agent/credential.json as root, "
            "else ~/.config/gpucloud/agent.json)",
        )
        sub.add_argument("--ca-file", help="PEM file of a private CA to trust for the console's certificate")
        sub.add_argument(
            "--allow-http",
            action="store_true",
            help="accept a plain-HTTP console beyond loopback (the credential in clear)",
        )
        sub.add_argument(
            "--work-dir", help="the agent's spool and files (default: the node's name beside the credential file)"
        )
        sub.add_argument("--probe", choices=["nvml", "simulated"], default="nvml", help="GPU probe (default: nvml)")
        sub.add_argument("--simulated-gpus", type=int, default=8, help="GPUs of the simulated probe")
        sub.add_argument("--allow-process-runtime", action="store_true", help="enable the non-isolated process runtime")
        sub.add_argument(
            "--spool-max-mb", type=int, default=256, help="MiB of undelivered reports kept on disk (default: 256)"
        )
        sub.add_argument("--loglevel", default="INFO")
    return parser


def cmd_manage(args: argparse.Namespace, extra: Sequence[str]) -> None:
    _setup_django()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["gpucloud manage", *extra])


def cmd_createoperator(args: argparse.Namespace) -> None:
    _setup_django()
    import getpass

    from django.core.exceptions import ValidationError

    from tenants.context import SYSTEM
    from tenants.services import create_operator

    password = os.environ.get("GPUCLOUD_ADMIN_PASSWORD") or getpass.getpass("Password: ")
    try:
        create_operator(actor=SYSTEM, username=args.username, password=password, email=args.email)
    except ValidationError as error:
        for field, messages in error.message_dict.items():
            print(f"{field}: {' '.join(messages)}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"Operator {args.username} created.")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpucloud", description="Multi-tenant GPU cloud console.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("up", "run the console with everything in one process"),
        ("serve", "serve the web process"),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument(
            "--host",
            default=os.environ.get("GPUCLOUD_HOST", "127.0.0.1"),
            help="address to listen on (default: GPUCLOUD_HOST, else 127.0.0.1; 0.0.0.0 for every address)",
        )
        sub.add_argument(
            "--port",
            type=int,
            default=int(os.environ.get("GPUCLOUD_PORT", "8000")),
            help="port to listen on (default: GPUCLOUD_PORT, else 8000)",
        )
        if name == "up":
            sub.add_argument("--demo", action="store_true", help="also add the simulated demo fleet (gpucloud demo)")
    commands.add_parser("demo", help="add the simulated demo fleet: GPU nodes, a pool, a tenant and queued jobs")
    worker = commands.add_parser("worker", help="run a Celery worker")
    worker.add_argument(
        "--queues",
        default="control,ingest",
        help="comma-separated queues (default: control,ingest; run one worker per queue so logs never delay control)",
    )
    worker.add_argument("--beat", action="store_true", help="also run the periodic scheduler")
    worker.add_argument(
        "--hostname", default="", help="the worker's node name (default: its queues and process id @ the host)"
    )
    worker.add_argument("--loglevel", default="INFO")
    agent = commands.add_parser(
        "agent",
        help="run the agent of one node",
        epilog="A GPU host that reaches the console over HTTPS only: gpucloud agent join --help, gpucloud agent run.",
    )
    agent.add_argument(
        "--node", default=os.environ.get("GPUCLOUD_NODE_NAME"), required="GPUCLOUD_NODE_NAME" not in os.environ
    )
    agent.add_argument("--probe", choices=["nvml", "simulated"], default="nvml", help="GPU probe (default: nvml)")
    agent.add_argument("--simulated-gpus", type=int, default=8, help="GPUs of the simulated probe")
    agent.add_argument("--allow-process-runtime", action="store_true", help="enable the non-isolated process runtime")
    agent.add_argument("--loglevel", default="INFO")
    commands.add_parser("migrate", help="apply database migrations")
    operator = commands.add_parser("createoperator", help="create a platform operator")
    operator.add_argument("username")
    operator.add_argument("--email", default="")
    commands.add_parser("manage", help="run a Django management command", add_help=False)
    commands.add_parser("simulate", help="replay a cluster trace through the scheduler in virtual time", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `gpucloud` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["manage"]:
        cmd_manage(argparse.Namespace(), argv[1:])
        return
    if argv[:1] == ["simulate"]:
        # Pure: the simulator needs neither Django nor a database.
        from jobs.scheduler.simulator.cli import main as simulate

        raise SystemExit(simulate(argv[1:]))
    if argv[:2] in (["agent", "join"], ["agent", "run"]):
        cmd_remote_agent(argv[1:])
        return
    if argv[:1] == ["migrate"]:
        cmd_manage(argparse.Namespace(), ["migrate", *argv[1:]])
        return
    args = _parser().parse_args(argv)
    handlers = {
        "up": cmd_up,
        "serve": cmd_serve,
        "worker": cmd_worker,
        "agent": cmd_agent,
        "createoperator": cmd_createoperator,
        "demo": cmd_demo,
    }
    handlers[args.command](args)
