"""Launching a process-runtime workload: claim its directory, write its launch file, start its supervisor.

`ProcessRuntime.start` holds the workload's start lock (`locked`), checks
that the directory is this workload's (`claim_identity`) and, unless a
supervisor has already reported, `launch`es one: its volumes are prepared
and laid out under `root/` (`process_workdir.lay_out`), its stop signal is
recorded in `stop.json`, and the command, its working directory (the host
path of the spec's `workdir`, else `work/`) and its environment (the
spec's with mount paths turned into host paths, the service port's
variable, PATH, HOME and LANG: nothing else of the agent's) go into
`launch.json` for `process_supervisor` to run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from inventory.drivers import process_supervisor as files
from inventory.drivers import process_workdir as workdir
from inventory.drivers.base import DriverTimeout, Mount, PermanentDriverError, TransientDriverError, WorkloadSpec
from inventory.drivers.process_workdir import Budget
from inventory.drivers.storage import prepare_mounts

_CLAIM_GRACE = 5.0
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def _stale(claim: Path) -> bool:
    """Return True when a supervisor's claim exists but its supervisor is dead (or never wrote its pid)."""
    try:
        pid, age = claim.read_text(), time.time() - claim.stat().st_mtime
    except FileNotFoundError:
        return False
    # An empty claim is one being written; only a long-empty one is abandoned.
    return not workdir.alive(int(pid), None) if pid else age > _CLAIM_GRACE


def _free_port() -> int:
    """Return a loopback port nothing listens on now.

    Another process may take it before the workload binds it: the workload
    then cannot listen and exits, and the endpoint reaches that other
    process. Acceptable only because this runtime is for single-host
    development, where every process is the developer's anyway.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((workdir.LOOPBACK, 0))
        port: int = probe.getsockname()[1]
    return port


@contextlib.contextmanager
def locked(directory: Path, budget: Budget) -> Iterator[None]:
    """Hold the workload's start lock; released by the kernel if this process dies."""
    with (directory / ".lock").open("w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                budget.check("waiting for a concurrent start")
                time.sleep(workdir.POLL)
        yield


def claim_identity(directory: Path, spec: WorkloadSpec) -> None:
    """Record `spec`'s identity in a new directory; raises PermanentDriverError `name_conflict` for another's."""
    found = workdir.read_json(directory / workdir.SPEC)
    if found is None:
        files.write_json(directory / workdir.SPEC, workdir.spec_identity(spec))
    elif found != workdir.spec_identity(spec):
        raise PermanentDriverError(
            f"a workload named {spec.name} exists but belongs to another workload", code="name_conflict"
        )


def launch(directory: Path, spec: WorkloadSpec, budget: Budget, *, python: str) -> None:
    """Start a supervisor unless one already holds the directory, then wait for it to report."""
    claim = directory / files.CLAIM
    if _stale(claim):
        claim.unlink()  # an earlier launch died before it started the command
    if not claim.exists():
        mounts = _prepared(spec)
        workdir.lay_out(directory, mounts)
        cwd = workdir.host_path(directory, mounts, spec.workdir) if spec.workdir else directory / "work"
        cwd.mkdir(parents=True, exist_ok=True)
        env = _environment(spec, mounts, cwd, _service_port(directory, spec))
        files.write_json(directory / workdir.STOP, {"signal": spec.stop_signal})
        request = {"command": list(spec.command), "env": env, "cwd": str(cwd)}
        fd = os.open(directory / files.LAUNCH, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(request, out)
        _spawn_supervisor(directory, budget, python)
    while not (directory / files.STATE).exists():
        budget.check(f"starting {spec.name}")
        time.sleep(workdir.POLL)


def _spawn_supervisor(directory: Path, budget: Budget, python: str) -> None:
    command = [python, "-m", "inventory.drivers.process_supervisor", str(directory)]
    try:
        with (directory / "supervisor.log").open("a") as errors:
            supervisor = subprocess.Popen(  # noqa: S603 -- this interpreter running our own module
                command, stdin=subprocess.DEVNULL, stdout=errors, stderr=errors, start_new_session=True
            )
        supervisor.wait(timeout=max(budget.left(), 0.1))  # returns as soon as it has detached
    except subprocess.TimeoutExpired as error:
        raise DriverTimeout(f"the supervisor did not start within {budget.timeout:g} s") from error
    except OSError as error:
        raise TransientDriverError(f"cannot start the supervisor: {error}", code="supervisor_failed") from error
    if supervisor.returncode != 0:
        raise TransientDriverError(
            f"the supervisor failed (exit {supervisor.returncode}); see {directory / 'supervisor.log'}",
            code="supervisor_failed",
        )


def _service_port(directory: Path, spec: WorkloadSpec) -> int | None:
    """Return the port the workload will serve on, recorded before it runs; a relaunch reuses it."""
    if spec.service_port is None:
        return None
    port = workdir.recorded_port(directory)
    if port is None:
        port = _free_port() if spec.service_port_env else spec.service_port
        files.write_json(directory / workdir.SERVICE, {"port": port})
    return port


def _prepared(spec: WorkloadSpec) -> tuple[Mount, ...]:
    """Prepare the spec's volumes for a process of the agent's own user: no other owner can be given."""
    return prepare_mounts((dataclasses.replace(m, uid=None, gid=None) for m in spec.mounts), None)


def _environment(spec: WorkloadSpec, mounts: tuple[Mount, ...], home: Path, port: int | None) -> dict[str, str]:
    base = {"PATH": os.environ.get("PATH", _DEFAULT_PATH), "HOME": str(home), "LANG": "C.UTF-8"}
    served = {spec.service_port_env: str(port)} if port is not None and spec.service_port_env else {}
    env = workdir.host_environment(spec.env, mounts)
    return {**base, **env, **served, "CUDA_VISIBLE_DEVICES": ",".join(spec.gpu_uuids)}
