"""`gpc submit`: from a spec file (`-f`, every document validated before any is submitted) or from flags.

Validation is the API's own (its validate endpoints, which write nothing), after the local checks of the
spec file; every problem of every document is reported at once, each at its line. Submissions carry an
Idempotency-Key, so the library's retries never submit twice. `--wait` hands over to `waiting.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpucloud_client.cli.state import AppState

if TYPE_CHECKING:
    from gpucloud_client.client import Client
    from gpucloud_client.models import Workload

    Submitted = tuple[str | None, Workload]  # a workload submitted, with its tenant (None: the context's)

pass_state = click.make_pass_decorator(AppState, ensure=True)

# Flag -> submission field, for the flags that map one to one (the API judges every value).
_FLAG_FIELDS = {
    "image": "image",
    "project_opt": "project",
    "pool": "pool",
    "kind": "kind",
    "gpus": "gpus_per_replica",
    "replicas": "replicas",
    "cpu": "cpu_milli",
    "memory": "memory_mib",
    "shm": "shm_mib",
    "priority": "priority_class",
    "max_runtime": "max_runtime_seconds",
    "requeue_limit": "requeue_limit",
    "stop_signal": "stop_signal",
    "preset": "preset",
}


@click.command()
@click.argument("name", required=False)
@click.argument("command", nargs=-1)
@click.option("-f", "--file", "spec_file", metavar="FILE", help="Spec file (YAML; - is stdin).")
@click.option("--image", metavar="IMAGE", help="Container image, e.g. pytorch/pytorch:2.4.")
@click.option("--project", "project_opt", metavar="SLUG", help="Project (default: the context's).")
@click.option("--pool", metavar="NAME", help="Node pool (default: the console's).")
@click.option("--kind", type=click.Choice(("job", "notebook")), help="Batch job (default) or notebook session.")
@click.option("--gpus", type=int, metavar="N", help="GPUs per replica (default 1; 0 for CPU only).")
@click.option("--replicas", type=int, metavar="N", help="Replicas of a gang, placed all or nothing (default 1).")
@click.option("--gpu-model", "gpu_models", multiple=True, metavar="MODEL", help="Acceptable GPU model (repeatable).")
@click.option("--cpu", type=int, metavar="MILLI", help="CPU per replica in thousandths of a core (default 1000).")
@click.option("--memory", type=int, metavar="MIB", help="Memory per replica in MiB (default 4096).")
@click.option("--shm", type=int, metavar="MIB", help="Shared memory per replica in MiB, at most --memory (default 64).")
@click.option("--priority", type=click.Choice(("low", "normal", "high")), help="Priority class.")
@click.option("--max-runtime", type=int, metavar="SECONDS", help="Stop it after this long (default: the quota's).")
@click.option("--requeue-limit", type=int, metavar="N", help="Times it is queued again after preemption or loss.")
@click.option("--stop-signal", metavar="SIGNAL", help="Signal that asks it to stop (default SIGTERM).")
@click.option("--preset", type=int, metavar="ID", help="Launch preset whose fields fill in what is left out.")
@click.option("-e", "--env", "env_pairs", multiple=True, metavar="K=V", help="Environment variable (repeatable).")
@click.option("--idempotency-key", metavar="KEY", help="Make a retried command submit nothing twice.")
@click.option("--dry-run", is_flag=True, help="Validate (locally and with the API) and submit nothing.")
@click.option("--wait", is_flag=True, help="Follow until it ends; exit with its exit code.")
@click.option("--logs", "with_logs", is_flag=True, help="With --wait: print the log on stdout meanwhile.")
@pass_state
def submit(state: AppState, /, name: str | None, command: tuple[str, ...], spec_file: str | None, **flags: Any) -> None:
    """Submit workloads: `submit -f spec.yaml`, or `submit NAME --image IMAGE [options] -- COMMAND...`.

    Nothing is submitted unless everything validates; every problem is reported at once, with its line
    for a spec file. With --wait, state changes are shown on stderr until the workloads end (a notebook:
    until it hibernates), and the exit code is the workload's (docs/cli.md). Put `--` before a COMMAND
    that has options of its own: `gpc submit train --image pytorch/pytorch:2.4 -- python train.py --lr 0.1`.
    """
    dry_run, wait, with_logs = flags.pop("dry_run"), flags.pop("wait"), flags.pop("with_logs")
    key = flags.pop("idempotency_key")
    if with_logs and not wait:
        raise click.UsageError("--logs needs --wait")
    if spec_file is not None:
        if name or command or _given(flags):
            raise click.UsageError("-f takes no NAME, COMMAND or workload options: put them in the file")
        text, source = read_spec(spec_file)
        with state.client() as client:
            submitted = _submit_spec(client, text, source, dry_run=dry_run, key=key)
    else:
        if not name:
            raise click.UsageError("name the workload (submit NAME --image IMAGE -- COMMAND), or use -f FILE")
        body = flags_body(name, command, flags)
        with state.client() as client:
            submitted = _submit_body(client, body, dry_run=dry_run, key=key)
    if submitted:
        _after_submit(state, submitted, as_list=spec_file is not None, wait=wait, with_logs=with_logs)


def _given(flags: dict[str, Any]) -> bool:
    """Return whether any workload option was given on the command line."""
    return any(value not in (None, ()) for value in flags.values())


def flags_body(name: str, command: tuple[str, ...], flags: dict[str, Any]) -> dict[str, Any]:
    """Return the submission body the flags describe: only what was given (the API fills in defaults)."""
    body: dict[str, Any] = {"name": name}
    body.update({field: flags[flag] for flag, field in _FLAG_FIELDS.items() if flags.get(flag) is not None})
    if flags.get("gpu_models"):
        body["gpu_models"] = list(flags["gpu_models"])
    if flags.get("env_pairs"):
        body["env"] = parse_env(flags["env_pairs"])
    if command:
        body["command"] = list(command)
    return body


def parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    """Return `K=V` pairs as a mapping; raises BadParameter naming each pair without `=`."""
    bad = [pair for pair in pairs if "=" not in pair]
    if bad:
        raise click.BadParameter(f"expected K=V, got {', '.join(map(repr, bad))}", param_hint="'--env'")
    return dict(pair.split("=", 1) for pair in pairs)


def read_spec(spec_file: str) -> tuple[str, str]:
    """Return (text, name to report lines against) of a spec file; `-` reads stdin.

    Raises BadParameter when the file cannot be read.
    """
    if spec_file == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        return Path(spec_file).read_text(encoding="utf-8"), spec_file
    except OSError as error:
        raise click.BadParameter(f"cannot read {spec_file}: {error.strerror}", param_hint="'-f'") from None


def _submit_spec(client: Client, text: str, source: str, *, dry_run: bool, key: str | None) -> list[Submitted]:
    """Check every document (locally and with the API); submit them all unless `dry_run` or any problem.

    Returns each workload with its tenant (None: the context's), in file order. Raises SpecError with
    every problem of every document (exit code 3) before submitting anything.
    """
    from gpucloud_client.cli.output import status
    from gpucloud_client.cli.specfile import check_file, read_documents
    from gpucloud_client.spec import submit_spec

    documents, local = read_documents(text, source)
    groups = check_file(client, documents, local)
    for group in groups:
        for note in group.budget_notes:
            status(f"{group.project}: {note}")
    count = len(documents)
    if dry_run:
        status(f"{source}: {count} workload{'s' if count != 1 else ''} valid; nothing submitted (--dry-run)")
        return []
    submitted = submit_spec(client, groups, idempotency_key=key)
    in_order = sorted(documents, key=lambda doc: doc.index)  # the order submit_spec answers in
    return [(doc.tenant, workload) for doc, workload in zip(in_order, submitted, strict=True)]


def _submit_body(client: Client, body: dict[str, Any], *, dry_run: bool, key: str | None) -> list[Submitted]:
    """Validate `body` with the API when `dry_run`, else submit it; ApiError names every failing field."""
    from gpucloud_client.cli.output import status

    if dry_run:
        notes = client.validate(body)
        status(f"{body['name']}: valid; nothing submitted (--dry-run)")
        for note in notes:
            status(note)
        return []
    return [(None, client.submit(body, idempotency_key=key))]


def _after_submit(state: AppState, submitted: list[Submitted], *, as_list: bool, wait: bool, with_logs: bool) -> None:
    """Report what was submitted (a list for -f, one object for flags); with `wait`, follow it and exit
    with the workloads' code (raises click's Exit)."""
    from gpucloud_client.cli.output import emit, status
    from gpucloud_client.cli.views import workloads_brief

    workloads = [workload for _, workload in submitted]
    for workload in workloads:
        status(f"submitted {workload.id} ({workload.name}): {workload.state}")
    if not wait:
        data: Any = [w.raw for w in workloads] if as_list else workloads[0].raw
        emit(state.output, data, lambda: workloads_brief(workloads))
        return
    from gpucloud_client.cli.waiting import wait_for

    raise click.exceptions.Exit(wait_for(state, submitted, as_list=as_list, with_logs=with_logs))
