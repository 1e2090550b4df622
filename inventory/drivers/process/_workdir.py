"""A process-runtime workload's directory, `work_dir/<name>/`: its file names and what reading them tells.

The directory is the workload's whole record (see `_runtime`): the
identity in `spec.json`, the service port in `service.json`, the stop
signal in `stop.json`, the sandbox layout under `root/` and what the
supervisor writes (`_supervisor`'s file names). Used by
`_runtime` and `_launch`.

The process runtime cannot remap paths, so a mount is a symlink
`root/<target>` to its volume directory (`lay_out`), and a path inside the
sandbox is turned into the host path the process must use (`host_path`,
`host_environment`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from inventory.drivers.base import STOP_SIGNALS, DriverTimeout, Handle, Mount, WorkloadSpec, endpoint_url
from inventory.drivers.process import _supervisor as files

SPEC = "spec.json"
SERVICE = "service.json"
STOP = "stop.json"
ROOT = "root"
LOOPBACK = "127.0.0.1"
POLL = 0.01


class Budget:
    """What is left of one call's timeout; `check` raises DriverTimeout once it is spent."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def check(self, what: str) -> None:
        if self.left() <= 0:
            raise DriverTimeout(f"{what} did not finish within {self.timeout:g} s")


def read_json(path: Path) -> dict[str, Any] | None:
    """Return the JSON object in `path`, or None when there is no such file."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return data


def alive(pid: int | None, started: int | None) -> bool:
    """Return True when `pid` runs and is the process that started at `started` (not a recycled pid)."""
    if not pid:
        return False
    current = files.start_time(pid)
    return current is not None and (started is None or current == started)


def spec_identity(spec: WorkloadSpec) -> dict[str, Any]:
    """Return what `spec.json` holds for `spec`: who the workload is, not what it runs."""
    return {
        "name": spec.name,
        "workload_id": spec.workload_id,
        "tenant": spec.tenant,
        "attempt": spec.attempt,
        "replica": spec.replica,
        "installation": spec.installation,
        "node": spec.node,
        "managed": True,
    }


def workload_handle(directory: Path, identity: dict[str, Any]) -> Handle:
    """Return the handle of the workload in `directory` with `identity`, with its endpoint when it has one."""
    keys = ("name", "workload_id", "tenant", "attempt", "replica")
    handle = {"runtime": "process", "dir": str(directory), **{key: identity[key] for key in keys}}
    port = recorded_port(directory)
    return handle | {"endpoint": endpoint_url(LOOPBACK, port)} if port is not None else handle


def recorded_port(directory: Path) -> int | None:
    """Return the port the workload of `directory` was told to serve on, or None when it has no service port."""
    service = read_json(directory / SERVICE)
    return int(service["port"]) if service is not None else None


def stop_signal(directory: Path) -> signal.Signals:
    """Return the signal `stop` sends first to the workload of `directory` (SIGTERM unless its spec named another)."""
    name = str((read_json(directory / STOP) or {}).get("signal", "SIGTERM"))
    return signal.Signals[name] if name in STOP_SIGNALS else signal.SIGTERM


# --- the sandbox layout --------------------------------------------------------------


def lay_out(directory: Path, mounts: Iterable[Mount]) -> None:
    """Make `directory/root/<target>` a symlink to each (prepared) mount's source, replacing an outdated one."""
    for mount in mounts:
        link = directory / ROOT / mount.target.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and os.readlink(link) == mount.source:
            continue
        fresh = link.with_name(f".{link.name}.{os.getpid()}")
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(mount.source)
        os.replace(fresh, link)


def _mounted(path: str, mounts: Iterable[Mount]) -> str | None:
    """Return the host path of sandbox `path` when it is inside a mount, else None (the deepest target wins)."""
    for mount in sorted(mounts, key=lambda mount: len(mount.target), reverse=True):
        if path == mount.target or path.startswith(mount.target.rstrip("/") + "/"):
            return mount.source + path[len(mount.target) :]
    return None


def host_path(directory: Path, mounts: Iterable[Mount], path: str) -> Path:
    """Return the host path of absolute sandbox `path`: inside its mount's source, else under `directory/root`."""
    return Path(_mounted(path, mounts) or directory / ROOT / path.lstrip("/"))


def host_environment(env: Mapping[str, str], mounts: Iterable[Mount]) -> dict[str, str]:
    """Return `env` with every value that starts with a mount's target rewritten to the host path.

    Only whole values are rewritten (`/projects/p/.checkpoints/7`), not
    paths inside lists (`a:/projects/p`): the process sees the host paths
    the container would have seen at its targets.
    """
    mounts = list(mounts)
    return {name: _mounted(value, mounts) or value for name, value in env.items()}
