"""A replica as the agent's runtime calls see it: which one a message names, and what to run.

The controller's JSON messages (`jobs.services.execution.replica_spec`,
`jobs.services.stopping.stop_message`) become a `ReplicaRef` (where reports
about the replica go) and, for a start, the driver's `WorkloadSpec`
(`driver_spec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inventory.drivers.base import Mount, Resources, RunAs, WorkloadSpec

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
    """Return the driver's `WorkloadSpec` for the controller's JSON `spec`, with its volumes and user.

    Besides what it runs: `"mounts"` (a list of `{"source",
    "target", "read_only", "root", "marker", "uid", "gid", "mode"}`),
    `"run_as"` (`{"uid", "gid", "groups"}` or null), `"workdir"` and
    `"stop_signal"`, and `"gang_across_hosts"` (true for a replica of a gang
    spread over hosts). An absent key keeps the old behaviour (no mounts,
    the runtime's user, the image's directory, SIGTERM, the tenant's
    network). Raises KeyError, TypeError or ValueError for a malformed
    entry; the runtime's
    `sandbox.check_sandbox` judges the values.
    """
    run_as = spec.get("run_as")
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
        mounts=tuple(_mount(entry) for entry in spec.get("mounts") or ()),
        run_as=RunAs(int(run_as["uid"]), int(run_as["gid"]), tuple(int(g) for g in run_as.get("groups") or ()))
        if run_as
        else None,
        workdir=str(spec.get("workdir") or ""),
        stop_signal=str(spec.get("stop_signal") or "SIGTERM"),
        gang_across_hosts=spec.get("gang_across_hosts") is True,
    )


def _mount(entry: dict[str, Any]) -> Mount:
    def number(key: str) -> int | None:
        return None if entry.get(key) is None else int(entry[key])

    return Mount(
        source=str(entry["source"]),
        target=str(entry["target"]),
        read_only=bool(entry.get("read_only", False)),  # anything but false/absent errs on the safe side
        root=str(entry.get("root") or ""),
        marker=str(entry.get("marker") or ""),
        uid=number("uid"),
        gid=number("gid"),
        mode=number("mode"),
        subdirs=tuple(str(rel) for rel in entry.get("subdirs") or ()),
    )
