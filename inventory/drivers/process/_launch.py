"""Launching a process-runtime workload: claim its directory, write its launch file, start its supervisor.

`ProcessRuntime.start` holds the workload's start lock (`locked`), checks
that the directory is this workload's (`claim_identity`) and, unless a
supervisor has already reported, `launch`es one: its volumes are prepared
and laid out under `root/` (`_workdir.lay_out`), its stop signal is
recorded in `stop.json`, and the command, its working directory (the host
path of the spec's `workdir`, else `work/`) and its environment (the
spec's with mount paths turned into host paths, the service port's
variable, PATH, HOME and LANG: nothing else of the agent's) go into
`launch.json` for `_supervisor` to run.

Run as root, the command runs as an unprivileged user (`workload_user`):
the spec's `run_as` (the owner's uid, the project's gid, the groups of the
volumes it mounts, as in a container), else `nobody`; its volumes are
prepared for that user, and its scratch directory `work/` is that user's
alone (0700). The workload directory itself and every file the runtime and
supervisor keep there (its identity, launch request, output, exit) stay
root's: 0711 and 0600, so the command can reach its `work/` but neither
read nor forge them. Run as another user, the command runs as that user,
like everything else of the agent's (the runtime is then not isolated).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from inventory.drivers.base import (
    DriverTimeout,
    Mount,
    PermanentDriverError,
    RunAs,
    TransientDriverError,
    WorkloadSpec,
)
from inventory.drivers.process import _supervisor as files
from inventory.drivers.process import _workdir as workdir
from inventory.drivers.process._workdir import Budget
from inventory.drivers.storage import prepare_mounts

_CLAIM_GRACE = 5.0
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# Who runs a workload that names no user when the agent is root: nobody, never root.
NOBODY = RunAs(uid=65534, gid=65534)
# The workload directory: reachable by the workload's user on the way to `work/`, listable by root only.
DIRECTORY_MODE = 0o711


def workload_user(spec: WorkloadSpec) -> RunAs | None:
    """Return the user `spec`'s command runs as: None (the agent's own) unless the agent is root.

    As root: the spec's `run_as` (never root: the sandbox refuses uid 0), else NOBODY.
    """
    if os.geteuid() != 0:
        return None
    return spec.run_as if spec.run_as is not None else NOBODY


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
        user = workload_user(spec)
        mounts = _prepared(spec, user)
        workdir.lay_out(directory, mounts)
        cwd = workdir.host_path(directory, mounts, spec.workdir) if spec.workdir else _scratch(directory, user)
        cwd.mkdir(parents=True, exist_ok=True)
        if user is not None and cwd.is_relative_to(directory):
            os.chown(cwd, user.uid, user.gid)  # a working directory outside its volumes: the user's too
        env = _environment(spec, mounts, cwd, _service_port(directory, spec))
        if user is not None:
            check_runnable(spec.command, env.get("PATH", _DEFAULT_PATH), user)
        files.write_json(directory / workdir.STOP, {"signal": spec.stop_signal})
        request: dict[str, object] = {"command": list(spec.command), "env": env, "cwd": str(cwd)}
        if user is not None:
            request["user"] = {"uid": user.uid, "gid": user.gid, "groups": list(user.groups)}
        fd = os.open(directory / files.LAUNCH, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(request, out)
        _spawn_supervisor(directory, budget, python)
    while not (directory / files.STATE).exists():
        budget.check(f"starting {spec.name}")
        time.sleep(workdir.POLL)


def _closed_to(path: Path, user: RunAs) -> Path | None:
    """Return the first of `path`'s directories (from /) that `user` may not pass through, or None."""
    for part in reversed([path.parent, *path.parent.parents]):
        mode = part.stat()
        if mode.st_uid == user.uid:
            allowed = mode.st_mode & stat.S_IXUSR
        elif mode.st_gid == user.gid or mode.st_gid in user.groups:
            allowed = mode.st_mode & stat.S_IXGRP
        else:
            allowed = mode.st_mode & stat.S_IXOTH
        if not allowed:
            return part
    return None


def _interpreter(program: Path) -> Path | None:
    """Return the interpreter a script's `#!` line names, or None for a binary or an unreadable file."""
    try:
        with program.open("rb") as head:
            first = head.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    return Path(words[0]) if words else None


class NotRunnable(PermanentDriverError):
    """A command's program (or its interpreter) lies behind a directory its user may not pass: `blocked`."""

    def __init__(self, message: str, *, blocked: Path) -> None:
        super().__init__(message, code="not_runnable")
        self.blocked = blocked


def check_runnable(command: tuple[str, ...] | list[str], path: str | None, user: RunAs) -> None:
    """Raise PermanentDriverError `not_runnable` when `user` cannot reach `command`'s program or its interpreter.

    A root agent runs the command as an unprivileged user: a program under a
    private home (a virtual environment whose Python lives in /root) would
    otherwise fail with exit 126 and no word of why. Programs not found on
    PATH (`path`; None: this process's) are left to the command's own error.
    """
    if not command:
        return
    found = shutil.which(command[0], path=path)
    if found is None:
        return
    program = Path(found)
    interpreter = _interpreter(program)
    # Both the path as written and where its links lead must be passable.
    for needed in (program, program.resolve(), interpreter, interpreter and interpreter.resolve()):
        if needed is None or not needed.exists():
            continue
        closed = _closed_to(needed, user)
        if closed is not None:
            raise NotRunnable(
                f"{command[0]} ({needed}) cannot be run by uid {user.uid}, which this runtime runs workloads as "
                f"when the agent is root: {closed} is closed to it. Install it where every user can run it, "
                "run the console as an unprivileged user, or use the docker runtime.",
                blocked=closed,
            )


def _scratch(directory: Path, user: RunAs | None) -> Path:
    """Return the workload's `work/` directory, made its user's alone (0700) when it runs as another user."""
    scratch = directory / "work"
    scratch.mkdir(mode=0o700, exist_ok=True)
    if user is not None:
        os.chown(scratch, user.uid, user.gid)
        scratch.chmod(0o700)
    return scratch


def _spawn_supervisor(directory: Path, budget: Budget, python: str) -> None:
    command = [python, "-m", "inventory.drivers.process._supervisor", str(directory)]
    try:
        log_fd = os.open(directory / "supervisor.log", os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o600)
        with os.fdopen(log_fd, "a") as errors:
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


def _prepared(spec: WorkloadSpec, user: RunAs | None) -> tuple[Mount, ...]:
    """Prepare the spec's volumes for `user`, as a container's; for the agent's own user (None), no other owner."""
    if user is not None:
        return prepare_mounts(spec.mounts, user)
    return prepare_mounts((dataclasses.replace(m, uid=None, gid=None) for m in spec.mounts), None)


def _environment(spec: WorkloadSpec, mounts: tuple[Mount, ...], home: Path, port: int | None) -> dict[str, str]:
    base = {"PATH": os.environ.get("PATH", _DEFAULT_PATH), "HOME": str(home), "LANG": "C.UTF-8"}
    served = {spec.service_port_env: str(port)} if port is not None and spec.service_port_env else {}
    env = workdir.host_environment(spec.env, mounts)
    return {**base, **env, **served, "CUDA_VISIBLE_DEVICES": ",".join(spec.gpu_uuids)}
