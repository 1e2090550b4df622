"""A replica as the agent's runtime calls see it: which one a message names, and what to run.

The controller's JSON messages (`jobs.services.execution.replica_spec`,
`jobs.services.stopping.stop_message`) become a `ReplicaRef` (where reports
about the replica go) and, for a start, the driver's `WorkloadSpec`
(`driver_spec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inventory.drivers.base import Resources, WorkloadSpec

# How long a runtime call about a replica (poll, stop, list, remove) may take; starts and log follows have
# their own, longer limits.
CALL_TIMEOUT = 30.0


@dataclass(frozen=True)
class ReplicaRef:
    """Which replica a message is about, and where reports about it go."""

    node: str
    runtime: str
    name: str
    workload_id: int
    attempt: int
    replica: int

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> ReplicaRef:
        return cls(
            node=str(message["node"]),
            runtime=str(message["runtime"]),
            name=str(message["name"]),
            workload_id=int(message["workload_id"]),
            attempt=int(message["attempt"]),
            replica=int(message["replica"]),
        )

    def ids(self) -> dict[str, int]:
        return {"workload_id": self.workload_id, "attempt": self.attempt, "replica": self.replica}


def driver_spec(spec: dict[str, Any]) -> WorkloadSpec:
    """Return the driver's `WorkloadSpec` for the controller's JSON `spec`."""
    return WorkloadSpec(
        name=str(spec["name"]),
        workload_id=str(spec["workload_id"]),
        tenant=str(spec["tenant"]),
        attempt=int(spec["attempt"]),
        image=str(spec["image"]),
        command=[str(part) for part in spec.get("command") or []],
        env={str(k): str(v) for k, v in (spec.get("env") or {}).items()},
        gpu_uuids=[str(u) for u in spec.get("gpu_uuids") or []],
        resources=Resources(cpus=float(spec.get("cpus", 1.0)), memory_mb=int(spec.get("memory_mb", 1024))),
        replica=int(spec.get("replica", 0)),
        service_port=spec.get("service_port"),
        service_port_env=str(spec.get("service_port_env") or ""),
    )
