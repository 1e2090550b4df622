"""Single-host development runtime: each workload is a local process group, not isolated.

Off unless the operator enables it (`enabled=False` refuses every call with
PermanentDriverError `process_runtime_disabled`). A process shares the
host's network, process table and file system. Run by a root agent, it
runs as the spec's `run_as` user (else nobody) with exactly that user's
groups, so the file permissions keep it out of the console's data
directory, other users' volumes and other workloads' directories
(`_launch`); run by any other agent, it runs as the agent's own user
and can read whatever that user can (the console's secret key and database
included): not isolated at all. Each workload gets a directory
`work_dir/<name>/` holding what a restarted controller needs to find it
again: the identity (`spec.json`), the supervisor's and the command's pids
(`state.json`), the output (`log.jsonl`) and the exit status (`exit.json`),
all written by `_supervisor`. GPUs are granted through
CUDA_VISIBLE_DEVICES (the UUIDs; empty for none).

Volumes (the spec's `mounts`) get the same layout as in a container,
under the workload directory: `root/<target>` (`root/home/<name>`,
`root/projects/<name>`, `root/datasets/<name>`) is a symlink to the
prepared volume directory. A process cannot see them at their targets, so
it runs in the host path of the spec's `workdir` (the home volume), with
HOME set to it, and every variable of the spec whose value starts with a
mount's target (`GPUCLOUD_CHECKPOINT_DIR=/projects/p/.checkpoints/7`) is
rewritten to the host path. This runtime cannot enforce `read_only`; as
a non-root agent it cannot enforce `run_as` or the volumes' owners either
(the process runs as the agent's user, and volumes it makes are that
user's). It is the single-host development runtime; use docker wherever
isolation matters.

`stop` sends the spec's `stop_signal` (recorded in `stop.json` at launch)
to the process group, then SIGKILL after the grace period.

Processes share the host's ports, so a workload with a service port is
given a free loopback port of its own in the variable its spec names
(`service_port_env`; without one it must listen on `service_port` itself),
kept in `service.json` so an adopted workload keeps its endpoint.

Handles: {"runtime": "process", "name", "dir", "workload_id", "tenant",
"attempt", "replica"}, plus "endpoint" (`http://127.0.0.1:PORT`) with a
service port. Log cursors are byte offsets into `log.jsonl`.

`_workdir` reads a workload's directory; `_launch` claims it
and starts the supervisor.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from inventory.drivers import policy, sandbox
from inventory.drivers.base import (
    DEFAULT_TIMEOUT,
    DriverTimeout,
    Handle,
    LogLine,
    ManagedWorkload,
    PermanentDriverError,
    PullListener,
    RuntimeInfo,
    WorkloadSpec,
    WorkloadStatus,
)
from inventory.drivers.process import _launch as launcher
from inventory.drivers.process import _supervisor as files
from inventory.drivers.process._workdir import (
    LOOPBACK,
    POLL,
    SERVICE,
    SPEC,
    Budget,
    alive,
    read_json,
    spec_identity,
    stop_signal,
    workload_handle,
)

__all__ = ["LOOPBACK", "SERVICE", "SPEC", "ProcessRuntime"]

_FOLLOW_INTERVAL = 0.1


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

    def start(
        self, spec: WorkloadSpec, *, timeout: float = DEFAULT_TIMEOUT, on_pull: PullListener | None = None
    ) -> Handle:
        """Launch `spec`'s command under a supervisor, or adopt the workload of that name; return its handle.

        With a service port, the handle's `endpoint` is
        `http://127.0.0.1:PORT`, the same for every later start of the same
        workload. Raises PermanentDriverError when disabled, when the
        environment, the service port or the sandbox
        (`sandbox.check_sandbox`) is refused (before anything runs), when a
        volume cannot be prepared (`storage`'s errors) or when the name
        belongs to another workload (`name_conflict`); DriverTimeout when
        the supervisor does not report within `timeout`. Nothing is pulled: `on_pull` is never called.
        """
        self._require_enabled()
        policy.check_environment(spec.env)
        policy.check_service_port(spec.service_port, spec.service_port_env)
        sandbox.check_sandbox(spec)
        policy.check_workload_name(spec.name)
        budget = Budget(timeout)
        directory = self.work_dir / spec.name
        self.work_dir.mkdir(mode=launcher.DIRECTORY_MODE, parents=True, exist_ok=True)
        directory.mkdir(mode=launcher.DIRECTORY_MODE, exist_ok=True)
        directory.chmod(launcher.DIRECTORY_MODE)  # whatever the umask: its files are root's, its `work/` the user's
        with launcher.locked(directory, budget):
            launcher.claim_identity(directory, spec)
            if not (directory / files.STATE).exists():
                launcher.launch(directory, spec, budget, python=self.python)
        return workload_handle(directory, spec_identity(spec))

    # --- poll, stop, remove --------------------------------------------------------

    def poll(self, handle: Handle, *, timeout: float = DEFAULT_TIMEOUT) -> WorkloadStatus:
        """Return the workload's state from its directory; `missing` when there is none."""
        return self._status(self._dir(handle))

    def _status(self, directory: Path) -> WorkloadStatus:
        state = read_json(directory / files.STATE)
        if not (directory / SPEC).exists():
            return WorkloadStatus(state="missing")
        if state is None:
            return WorkloadStatus(state="created")
        started = state.get("started_at")
        ended = read_json(directory / files.EXIT)
        if ended is not None:
            return WorkloadStatus(
                state="exited",
                exit_code=ended.get("exit_code"),
                started_at=started,
                finished_at=ended.get("finished_at"),
                message=str(ended.get("message", "")),
            )
        if alive(state.get("supervisor_pid"), state.get("supervisor_start")):
            return WorkloadStatus(state="running", started_at=started)
        if alive(state.get("pid"), state.get("child_start")):
            return WorkloadStatus(state="running", started_at=started, message="supervisor gone: output not captured")
        # The supervisor may have written exit.json between the two reads above.
        if (directory / files.EXIT).exists():
            return self._status(directory)
        return WorkloadStatus(state="exited", started_at=started, message="supervisor died before the exit status")

    def stop(self, handle: Handle, *, grace_seconds: float = 30.0, timeout: float = DEFAULT_TIMEOUT) -> WorkloadStatus:
        """Send the spec's stop signal to the process group, SIGKILL it after `grace_seconds`; return the final status.

        Idempotent: exited and missing workloads are returned as they are.
        Raises DriverTimeout when the group has not ended `timeout` seconds
        after the SIGKILL.
        """
        directory = self._dir(handle)
        status = self._status(directory)
        if status.state != "running":
            return status
        state = read_json(directory / files.STATE) or {}
        pgid, started = state.get("pgid"), state.get("child_start")
        self._signal(pgid, started, stop_signal(directory))
        if not self._wait_exited(directory, Budget(grace_seconds)):
            self._signal(pgid, started, signal.SIGKILL)
            if not self._wait_exited(directory, Budget(timeout)):
                raise DriverTimeout(f"{handle['name']} still runs {timeout:g} s after SIGKILL")
        return self._status(directory)

    @staticmethod
    def _signal(pgid: int | None, started: int | None, signum: int) -> None:
        if pgid and alive(pgid, started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signum)

    def _wait_exited(self, directory: Path, budget: Budget) -> bool:
        while self._status(directory).state == "running":
            if budget.left() <= 0:
                return False
            time.sleep(POLL)
        return True

    def remove(self, handle: Handle, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Kill the workload if it still runs and delete its directory; a missing one is fine.

        Its volumes stay: the layout's symlinks are deleted, never followed.
        """
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
        return self._follow(directory, int(since or 0), follow, Budget(timeout))

    def _follow(self, directory: Path, offset: int, follow: bool, budget: Budget) -> Iterator[LogLine]:
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
            identity = read_json(spec_file) or {}
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
                    handle=workload_handle(directory, identity),
                    installation=str(identity.get("installation") or ""),
                    node=str(identity.get("node") or ""),
                )
            )
        return found

    def info(self, *, timeout: float = DEFAULT_TIMEOUT) -> RuntimeInfo:
        """Return the host's CPUs and memory; `isolated` is False: processes share the host."""
        self._require_enabled()
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return RuntimeInfo(
            kind=self.kind, isolated=False, cpu_cores=os.cpu_count(), memory_mib=pages * page_size // (1024 * 1024)
        )
