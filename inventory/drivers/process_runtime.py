"""Single-host development runtime: each workload is a local process group, not isolated.

Off unless the operator enables it (`enabled=False` refuses every call with
PermanentDriverError `process_runtime_disabled`): a process runs with the
agent's user and sees the whole host. Each workload gets a directory
`work_dir/<name>/` holding what a restarted controller needs to find it
again: the identity (`spec.json`), the supervisor's and the command's pids
(`state.json`), the output (`log.jsonl`) and the exit status (`exit.json`),
all written by `process_supervisor`. GPUs are granted through
CUDA_VISIBLE_DEVICES (the UUIDs; empty for none).

Processes share the host's ports, so a workload with a service port is
given a free loopback port of its own in the variable its spec names
(`service_port_env`; without one it must listen on `service_port` itself),
kept in `service.json` so an adopted workload keeps its endpoint.

Handles: {"runtime": "process", "name", "dir", "workload_id", "tenant",
"attempt", "replica"}, plus "endpoint" (`http://127.0.0.1:PORT`) with a
service port. Log cursors are byte offsets into `log.jsonl`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from inventory.drivers import policy
from inventory.drivers import process_supervisor as files
from inventory.drivers.base import (
    DEFAULT_TIMEOUT,
    DriverTimeout,
    Handle,
    LogLine,
    ManagedWorkload,
    PermanentDriverError,
    RuntimeInfo,
    TransientDriverError,
    WorkloadSpec,
    WorkloadStatus,
    endpoint_url,
)

SPEC = "spec.json"
SERVICE = "service.json"
LOOPBACK = "127.0.0.1"
_POLL = 0.01
_CLAIM_GRACE = 5.0
_FOLLOW_INTERVAL = 0.1
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


class _Budget:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def check(self, what: str) -> None:
        if self.left() <= 0:
            raise DriverTimeout(f"{what} did not finish within {self.timeout:g} s")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return data


def _alive(pid: int | None, started: int | None) -> bool:
    """Return True when `pid` runs and is the process that started at `started` (not a recycled pid)."""
    if not pid:
        return False
    current = files.start_time(pid)
    return current is not None and (started is None or current == started)


def _stale(claim: Path) -> bool:
    """Return True when a supervisor's claim exists but its supervisor is dead (or never wrote its pid)."""
    try:
        pid, age = claim.read_text(), time.time() - claim.stat().st_mtime
    except FileNotFoundError:
        return False
    # An empty claim is one being written; only a long-empty one is abandoned.
    return not _alive(int(pid), None) if pid else age > _CLAIM_GRACE


def _identity(spec: WorkloadSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "workload_id": spec.workload_id,
        "tenant": spec.tenant,
        "attempt": spec.attempt,
        "replica": spec.replica,
        "managed": True,
    }


def _handle(directory: Path, identity: dict[str, Any]) -> Handle:
    keys = ("name", "workload_id", "tenant", "attempt", "replica")
    handle = {"runtime": "process", "dir": str(directory), **{key: identity[key] for key in keys}}
    port = _recorded_port(directory)
    return handle | {"endpoint": endpoint_url(LOOPBACK, port)} if port is not None else handle


def _recorded_port(directory: Path) -> int | None:
    """Return the port the workload of `directory` was told to serve on, or None when it has no service port."""
    service = _read_json(directory / SERVICE)
    return int(service["port"]) if service is not None else None


def _free_port() -> int:
    """Return a loopback port nothing listens on now.

    Another process may take it before the workload binds it: the workload
    then cannot listen and exits, and the endpoint reaches that other
    process. Acceptable only because this runtime is for single-host
    development, where every process is the developer's anyway.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
    return port


class ProcessRuntime:
    """Runs workloads as supervised local process groups under `work_dir`; refuses everything unless `enabled`."""

    kind = "process"

    def __init__(self, work_dir: Path, enabled: bool, *, python: str = sys.executable) -> None:
        self.work_dir = Path(work_dir)
        self.enabled = enabled
        self.python = python

    def _require_enabled(self) -> None:
        if not self.enabled:
            raise PermanentDriverError(
                "the process runtime is disabled on this agent (it does not isolate workloads)",
                code="process_runtime_disabled",
            )

    def _dir(self, handle: Handle) -> Path:
        self._require_enabled()
        if handle.get("runtime") != "process" or not handle.get("name"):
            raise PermanentDriverError("not a process runtime handle", code="invalid_handle")
        policy.check_workload_name(str(handle["name"]))
        return self.work_dir / str(handle["name"])

    # --- start -------------------------------------------------------------------

    def start(self, spec: WorkloadSpec, *, timeout: float = DEFAULT_TIMEOUT) -> Handle:
        """Launch `spec`'s command under a supervisor, or adopt the workload of that name; return its handle.

        With a service port, the handle's `endpoint` is
        `http://127.0.0.1:PORT`, the same for every later start of the same
        workload. Raises PermanentDriverError when disabled, when the
        environment or the service port is refused (before anything runs) or when the name belongs to another
        workload (`name_conflict`); DriverTimeout when the supervisor does
        not report within `timeout`.
        """
        self._require_enabled()
        policy.check_environment(spec.env)
        policy.check_service_port(spec.service_port, spec.service_port_env)
        policy.check_workload_name(spec.name)
        budget = _Budget(timeout)
        directory = self.work_dir / spec.name
        directory.mkdir(parents=True, exist_ok=True)
        with self._locked(directory, budget):
            self._claim_identity(directory, spec)
            if not (directory / files.STATE).exists():
                self._launch(directory, spec, budget)
        return _handle(directory, _identity(spec))

    @contextlib.contextmanager
    def _locked(self, directory: Path, budget: _Budget) -> Iterator[None]:
        """Hold the workload's start lock; released by the kernel if this process dies."""
        with (directory / ".lock").open("w") as lock:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    budget.check("waiting for a concurrent start")
                    time.sleep(_POLL)
            yield

    def _claim_identity(self, directory: Path, spec: WorkloadSpec) -> None:
        found = _read_json(directory / SPEC)
        if found is None:
            files.write_json(directory / SPEC, _identity(spec))
        elif found != _identity(spec):
            raise PermanentDriverError(
                f"a workload named {spec.name} exists but belongs to another workload", code="name_conflict"
            )

    def _launch(self, directory: Path, spec: WorkloadSpec, budget: _Budget) -> None:
        """Start a supervisor unless one already holds the directory, then wait for it to report."""
        claim = directory / files.CLAIM
        if _stale(claim):
            claim.unlink()  # an earlier launch died before it started the command
        if not claim.exists():
            work = directory / "work"
            work.mkdir(exist_ok=True)
            env = self._environment(spec, work, self._service_port(directory, spec))
            launch = {"command": list(spec.command), "env": env, "cwd": str(work)}
            fd = os.open(directory / files.LAUNCH, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(launch, out)
            self._spawn_supervisor(directory, budget)
        while not (directory / files.STATE).exists():
            budget.check(f"starting {spec.name}")
            time.sleep(_POLL)

    def _spawn_supervisor(self, directory: Path, budget: _Budget) -> None:
        command = [self.python, "-m", "inventory.drivers.process_supervisor", str(directory)]
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

    @staticmethod
    def _service_port(directory: Path, spec: WorkloadSpec) -> int | None:
        """Return the port the workload will serve on, recorded before it runs; a relaunch reuses it."""
        if spec.service_port is None:
            return None
        port = _recorded_port(directory)
        if port is None:
            port = _free_port() if spec.service_port_env else spec.service_port
            files.write_json(directory / SERVICE, {"port": port})
        return port

    @staticmethod
    def _environment(spec: WorkloadSpec, work: Path, port: int | None) -> dict[str, str]:
        base = {"PATH": os.environ.get("PATH", _DEFAULT_PATH), "HOME": str(work), "LANG": "C.UTF-8"}
        served = {spec.service_port_env: str(port)} if port is not None and spec.service_port_env else {}
        return {**base, **spec.env, **served, "CUDA_VISIBLE_DEVICES": ",".join(spec.gpu_uuids)}

    # --- poll, stop, remove --------------------------------------------------------

    def poll(self, handle: Handle, *, timeout: float = DEFAULT_TIMEOUT) -> WorkloadStatus:
        """Return the workload's state from its directory; `missing` when there is none."""
        return self._status(self._dir(handle))

    def _status(self, directory: Path) -> WorkloadStatus:
        state = _read_json(directory / files.STATE)
        if not (directory / SPEC).exists():
            return WorkloadStatus(state="missing")
        if state is None:
            return WorkloadStatus(state="created")
        started = state.get("started_at")
        ended = _read_json(directory / files.EXIT)
        if ended is not None:
            return WorkloadStatus(
                state="exited",
                exit_code=ended.get("exit_code"),
                started_at=started,
                finished_at=ended.get("finished_at"),
                message=str(ended.get("message", "")),
            )
        if _alive(state.get("supervisor_pid"), state.get("supervisor_start")):
            return WorkloadStatus(state="running", started_at=started)
        if _alive(state.get("pid"), state.get("child_start")):
            return WorkloadStatus(state="running", started_at=started, message="supervisor gone: output not captured")
        # The supervisor may have written exit.json between the two reads above.
        if (directory / files.EXIT).exists():
            return self._status(directory)
        return WorkloadStatus(state="exited", started_at=started, message="supervisor died before the exit status")

    def stop(self, handle: Handle, *, grace_seconds: float = 30.0, timeout: float = DEFAULT_TIMEOUT) -> WorkloadStatus:
        """SIGTERM the process group, SIGKILL it after `grace_seconds`, and return the final status.

        Idempotent: exited and missing workloads are returned as they are.
        Raises DriverTimeout when the group has not ended `timeout` seconds
        after the SIGKILL.
        """
        directory = self._dir(handle)
        status = self._status(directory)
        if status.state != "running":
            return status
        state = _read_json(directory / files.STATE) or {}
        pgid, started = state.get("pgid"), state.get("child_start")
        self._signal(pgid, started, signal.SIGTERM)
        if not self._wait_exited(directory, _Budget(grace_seconds)):
            self._signal(pgid, started, signal.SIGKILL)
            if not self._wait_exited(directory, _Budget(timeout)):
                raise DriverTimeout(f"{handle['name']} still runs {timeout:g} s after SIGKILL")
        return self._status(directory)

    @staticmethod
    def _signal(pgid: int | None, started: int | None, signum: int) -> None:
        if pgid and _alive(pgid, started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signum)

    def _wait_exited(self, directory: Path, budget: _Budget) -> bool:
        while self._status(directory).state == "running":
            if budget.left() <= 0:
                return False
            time.sleep(_POLL)
        return True

    def remove(self, handle: Handle, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Kill the workload if it still runs and delete its directory; a missing one is fine."""
        directory = self._dir(handle)
        if self._status(directory).state == "running":
            self.stop(handle, grace_seconds=0, timeout=timeout)
        shutil.rmtree(directory, ignore_errors=True)

    # --- logs --------------------------------------------------------------------

    def logs(
        self, handle: Handle, *, since: str | None = None, follow: bool = False, timeout: float = DEFAULT_TIMEOUT
    ) -> Iterator[LogLine]:
        """Yield output lines after cursor `since` (a byte offset into the log); with `follow`, until the end.

        Raises PermanentDriverError `not_found` for a missing workload,
        `invalid_cursor` for a bad cursor; with `follow`, DriverTimeout if
        the workload still runs after `timeout` seconds (resume from the
        last cursor).
        """
        directory = self._dir(handle)
        if not (directory / SPEC).exists():
            raise PermanentDriverError(f"no workload {handle['name']}", code="not_found")
        if since is not None and not since.isdigit():
            raise PermanentDriverError(f"invalid log cursor {since!r}", code="invalid_cursor")
        return self._follow(directory, int(since or 0), follow, _Budget(timeout))

    def _follow(self, directory: Path, offset: int, follow: bool, budget: _Budget) -> Iterator[LogLine]:
        while True:
            # The state is read before the log: an exit seen here means the read below has every line.
            running = follow and self._status(directory).state in ("created", "running")
            for line in self._read(directory / files.LOG, offset):
                offset = int(line.cursor)
                yield line
            if not running:
                return
            budget.check("following the log")
            time.sleep(min(_FOLLOW_INTERVAL, max(budget.left(), 0)))

    @staticmethod
    def _read(path: Path, offset: int) -> Iterator[LogLine]:
        try:
            log = path.open("rb")
        except FileNotFoundError:
            return
        with log:
            log.seek(offset)
            for raw in log:
                if not raw.endswith(b"\n"):
                    return  # being written; the next read gets it whole
                offset += len(raw)
                entry = json.loads(raw)
                yield LogLine(timestamp=entry["ts"], stream=entry["stream"], text=entry["text"], cursor=str(offset))

    # --- list, info ----------------------------------------------------------------

    def list_managed(self, *, timeout: float = DEFAULT_TIMEOUT) -> list[ManagedWorkload]:
        """Return every workload with a directory under `work_dir`, running or exited."""
        self._require_enabled()
        found = []
        for spec_file in sorted(self.work_dir.glob(f"*/{SPEC}")):
            identity = _read_json(spec_file) or {}
            if not identity.get("managed"):
                continue
            directory = spec_file.parent
            status = self._status(directory)
            found.append(
                ManagedWorkload(
                    name=identity["name"],
                    workload_id=identity["workload_id"],
                    tenant=identity["tenant"],
                    attempt=int(identity["attempt"]),
                    replica=int(identity["replica"]),
                    state=status.state,
                    handle=_handle(directory, identity),
                )
            )
        return found

    def info(self, *, timeout: float = DEFAULT_TIMEOUT) -> RuntimeInfo:
        """Return the host's CPUs and memory; `isolated` is False: processes share the host."""
        self._require_enabled()
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return RuntimeInfo(
            kind=self.kind, isolated=False, cpus=os.cpu_count(), memory_mb=pages * page_size // (1024 * 1024)
        )
