"""A process-runtime workload's directory, `work_dir/<name>/`: its file names and what reading them tells.

The directory is the workload's whole record (see `process_runtime`): the
identity in `spec.json`, the service port in `service.json`, and what the
supervisor writes (`process_supervisor`'s file names). Used by
`process_runtime` and `process_launch`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from inventory.drivers import process_supervisor as files
from inventory.drivers.base import DriverTimeout, Handle, WorkloadSpec, endpoint_url

SPEC = "spec.json"
SERVICE = "service.json"
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
