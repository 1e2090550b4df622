"""The simulated workloads of this process: one record per workload, and the registry a node's runtime and probe share.

A record holds everything its handle holds, so a workload's state follows
from the handle and the clock alone (another process can poll it); the
registry adds what only this process knows: stops and removals. Used by
`_runtime` (the runtime) and `_probe` (which follows the
workloads running on each GPU).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from inventory.drivers.base import Handle, PermanentDriverError

Clock = Callable[[], float]

SIGTERM_EXIT_CODE = 143


@dataclass
class SimulatedWorkload:
    """One simulated workload; everything but `stopped_at` and `removed` is also in its handle."""

    name: str
    workload_id: str
    tenant: str
    attempt: int
    replica: int
    started_at: float
    duration: float
    exit_code: int
    utilization: float
    log_interval: float
    gpu_uuids: tuple[str, ...] = ()
    installation: str = ""  # the console installation that started it ("" when unrecorded)
    stopped_at: float | None = None
    removed: bool = False

    @property
    def ends_at(self) -> float:
        natural = self.started_at + self.duration
        return natural if self.stopped_at is None else min(natural, self.stopped_at)

    @property
    def final_code(self) -> int:
        stopped_early = self.stopped_at is not None and self.stopped_at < self.started_at + self.duration
        return SIGTERM_EXIT_CODE if stopped_early else self.exit_code

    def running(self, now: float) -> bool:
        return not self.removed and now < self.ends_at

    def handle(self, node: str) -> Handle:
        return {
            "runtime": "simulated",
            "node": node,
            "name": self.name,
            "workload_id": self.workload_id,
            "tenant": self.tenant,
            "attempt": self.attempt,
            "replica": self.replica,
            "started_at": self.started_at,
            "duration": self.duration,
            "exit_code": self.exit_code,
            "utilization": self.utilization,
            "log_interval": self.log_interval,
            "gpu_uuids": list(self.gpu_uuids),
            "installation": self.installation,
        }

    @classmethod
    def from_handle(cls, handle: Handle) -> SimulatedWorkload:
        try:
            return cls(
                name=str(handle["name"]),
                workload_id=str(handle["workload_id"]),
                tenant=str(handle["tenant"]),
                attempt=int(handle["attempt"]),
                replica=int(handle["replica"]),
                started_at=float(handle["started_at"]),
                duration=float(handle["duration"]),
                exit_code=int(handle["exit_code"]),
                utilization=float(handle["utilization"]),
                log_interval=float(handle["log_interval"]),
                gpu_uuids=tuple(handle.get("gpu_uuids") or ()),
                installation=str(handle.get("installation") or ""),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise PermanentDriverError("not a simulated runtime handle", code="invalid_handle") from error


# Node name -> workload name -> workload; shared by the runtime and probe of a node in this process.
registry: dict[str, dict[str, SimulatedWorkload]] = {}
registry_lock = threading.Lock()


def node_workloads(node: str) -> dict[str, SimulatedWorkload]:
    """Return the registry's workloads of `node` by name, made empty on first use."""
    with registry_lock:
        return registry.setdefault(node, {})
