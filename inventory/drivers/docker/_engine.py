"""Talking to the Docker engine: the API version, call budgets, error translation, what inspect answers mean.

Used by `_runtime`; nothing here holds state.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
import urllib3.exceptions

from inventory.drivers.base import (
    DriverError,
    DriverTimeout,
    Handle,
    PermanentDriverError,
    TransientDriverError,
    WorkloadState,
    WorkloadStatus,
)
from inventory.drivers.timestamps import parse_ns

DEFAULT_DOCKER_URL = "unix:///var/run/docker.sock"
API_VERSION = "1.41"
"""Pinned, so no call is spent negotiating; device requests need 1.40 and every current engine speaks 1.41."""

STATES: dict[str, WorkloadState] = {
    "created": "created",
    "running": "running",
    "paused": "running",
    "restarting": "running",
    "removing": "exited",
    "exited": "exited",
    "dead": "exited",
}
_NO_GPU_DRIVER = "could not select device driver"
_TOOLKIT_COMMANDS = (["nvidia-ctk", "--version"], ["nvidia-container-cli", "--version"])


class Budget:
    """What is left of one call's timeout."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DriverTimeout(f"the Docker engine did not finish within {self.timeout:g} s")
        return left


@contextmanager
def engine_errors(action: str) -> Iterator[None]:
    """Translate docker SDK, requests and socket errors into driver errors."""
    try:
        yield
    except DriverError:
        raise
    except docker.errors.ImageNotFound as error:
        raise PermanentDriverError(f"{action}: image not found: {error.explanation}", code="image_not_found") from error
    except docker.errors.APIError as error:
        status = error.status_code or 0
        message = f"{action}: {status} {error.explanation or error}"
        if _NO_GPU_DRIVER in str(error.explanation):
            # A 500, but no retry helps: the engine has no NVIDIA container toolkit to hand GPUs out.
            raise PermanentDriverError(message, code="nvidia_toolkit_missing") from error
        if 400 <= status < 500:
            code = {404: "not_found", 409: "conflict"}.get(status, "refused")
            raise PermanentDriverError(message, code=code) from error
        raise TransientDriverError(message, code="engine_error") from error
    except (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, TimeoutError) as error:
        raise DriverTimeout(f"{action}: the Docker engine did not answer in time") from error
    except requests.exceptions.ConnectionError as error:
        if any(isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in error.args):
            raise DriverTimeout(f"{action}: the Docker engine did not answer in time") from error
        raise TransientDriverError(f"{action}: engine unreachable: {error}", code="engine_unreachable") from error
    except (docker.errors.DockerException, requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as error:
        raise TransientDriverError(f"{action}: {error}", code="engine_error") from error
    except OSError as error:
        raise TransientDriverError(f"{action}: engine unreachable: {error}", code="engine_unreachable") from error


def container_id(handle: Handle) -> str:
    """Return the container id a Docker handle holds; raises PermanentDriverError for any other handle."""
    if handle.get("runtime") != "docker" or not handle.get("id"):
        raise PermanentDriverError("not a Docker runtime handle", code="invalid_handle")
    return str(handle["id"])


def _time(value: str | None) -> str | None:
    return None if not value or value.startswith("0001-") else value


def status_from(attrs: dict[str, Any]) -> WorkloadStatus:
    """Return the driver status that `inspect_container`'s answer `attrs` describes."""
    state = attrs.get("State") or {}
    kind = STATES.get(str(state.get("Status")), "exited")
    message = str(state.get("Error") or "")
    if state.get("OOMKilled"):
        message = "killed: out of memory" + (f"; {message}" if message else "")
    return WorkloadStatus(
        state=kind,
        exit_code=int(state["ExitCode"]) if kind == "exited" and state.get("ExitCode") is not None else None,
        started_at=_time(state.get("StartedAt")),
        finished_at=_time(state.get("FinishedAt")) if kind == "exited" else None,
        message=message,
    )


def networks_named(api: docker.APIClient, name: str) -> list[dict[str, Any]]:
    """Return the networks called exactly `name`, oldest first (the engine's filter matches substrings)."""
    found = [n for n in api.networks(names=[name]) if n.get("Name") == name]
    return sorted(found, key=lambda n: (parse_ns(n["Created"]), n["Id"]))


_host_locks_guard = threading.Lock()
_host_locks: dict[str, threading.Lock] = {}


@contextmanager
def host_lock(name: str, *, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive lock called `name` shared by every thread and process on this host; yield whether held.

    Engines before API 1.44 enforce unique network names only best-effort,
    so creators that race can each make one, and a container may join the
    loser before it is cleaned up. Serializing creation on the host (where
    the agent and its engine live) removes the race instead of repairing it.
    A thread lock guards the process, because `flock` locks are per process
    only when taken through separate file descriptors of the same process.
    With `wait` false a lock someone else holds is not waited for: the body
    runs with False (the caller must then leave what the lock guards alone).
    """
    with _host_locks_guard:
        local = _host_locks.setdefault(name, threading.Lock())
    if not local.acquire(blocking=wait):
        yield False
        return
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    path = f"{tempfile.gettempdir()}/gpucloud-{digest}.lock"
    try:
        with open(path, "a+b") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        local.release()


def version_tuple(version: str | None) -> tuple[int, ...]:
    """Return the numeric parts of a version string: "1.41" -> (1, 41); () for None."""
    return tuple(int(part) for part in re.findall(r"\d+", version or "")[:3])


def toolkit_version(timeout: float = 5.0) -> str | None:
    """Return the NVIDIA container toolkit version installed on this host, or None when none answers."""
    for command in _TOOLKIT_COMMANDS:
        path = shutil.which(command[0])
        if path is None:
            continue
        try:
            result = subprocess.run(  # noqa: S603 -- a fixed command found on PATH
                [path, *command[1:]], capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        match = re.search(r"(\d+\.\d+\.\d+)", result.stdout)
        if result.returncode == 0 and match:
            return match.group(1)
    return None


CGROUP_ROOT = Path("/sys/fs/cgroup")
_KILL_ROUNDS = 50


def container_cgroups(container: str, root: Path = CGROUP_ROOT) -> list[Path]:
    """Return the cgroup directories of container id `container` that this host shows, in any hierarchy.

    Docker's cgroupfs driver names them `<id>` under `docker/`, its systemd
    driver `docker-<id>.scope` under `system.slice/`; cgroup v1 has one per
    controller one level deeper. A custom cgroup parent is not searched.
    """
    found: list[Path] = []
    for name in (f"docker/{container}", f"system.slice/docker-{container}.scope"):
        found += [path for path in (root / name, *root.glob(f"*/{name}")) if path.is_dir()]
    return found


def _engine_cgroups_visible(root: Path) -> bool:
    """Whether `root` shows the cgroups Docker makes (a cgroup namespace of one's own shows only its own)."""
    parents = ("docker", "system.slice")
    return root.is_dir() and any(path.is_dir() for name in parents for path in (root / name, *root.glob(f"*/{name}")))


def kill_container_processes(container: str, root: Path = CGROUP_ROOT) -> bool | None:
    """SIGKILL every process of container id `container` through its cgroups; return whether none is left.

    This reaches a run the engine lost track of (a task containerd started
    while dockerd died), which no Engine API call can stop. None when this
    host shows no cgroup hierarchy at all (the engine is elsewhere, or the
    caller runs in a cgroup namespace of its own): nothing can be said.
    True also when the container has no cgroup left: containerd removed it
    with its ended task (an engine whose cgroups are visible keeps those of
    live containers).
    """
    if not _engine_cgroups_visible(root):
        return None
    for _ in range(_KILL_ROUNDS):
        groups = container_cgroups(container, root)
        pids: set[int] = set()
        for group in groups:
            with suppress(OSError):
                pids |= {int(pid) for pid in (group / "cgroup.procs").read_text().split()}
        if not pids:
            return True
        # Frozen first: a shell whose child is killed before it would otherwise run its next command
        # (output, a new child) in the moment before its own SIGKILL lands.
        _set_frozen(groups, frozen=True)
        for pid in pids:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _set_frozen(groups, frozen=False)  # a frozen task dies of its pending SIGKILL once thawed, running nothing
        time.sleep(0.1)  # a process forking while it is killed shows its children on the next read
    return False


def _set_frozen(groups: list[Path], *, frozen: bool) -> None:
    """Freeze or thaw every freezer of `groups` (cgroup v1 `freezer.state`, v2 `cgroup.freeze`) that exists."""
    for group in groups:
        for name, value in (
            ("freezer.state", "FROZEN" if frozen else "THAWED"),
            ("cgroup.freeze", "1" if frozen else "0"),
        ):
            with suppress(OSError):
                (group / name).write_text(value)
    if frozen:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and any(_freezing(group) for group in groups):
            time.sleep(0.01)


def _freezing(group: Path) -> bool:
    """Whether a v1 freezer of `group` is still on its way to FROZEN (v2 needs no wait: fatal signals pass a freeze)."""
    try:
        return (group / "freezer.state").read_text().strip() == "FREEZING"
    except OSError:
        return False
