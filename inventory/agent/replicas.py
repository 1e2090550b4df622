"""A replica as the agent's runtime calls see it: which one a message names, and what to run.

The controller's protocol messages (`common.protocol.messages`: a start's
`ReplicaSpec`, `StopReplica`, `WatchReplica`) become a `ReplicaRef` (where
reports about the replica go) and, for a start, the driver's `WorkloadSpec`
(`driver_spec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypedDict

from common.protocol.messages import RESOURCE_FIELDS, MountSpec, ReplicaSpec
from inventory.drivers.base import Mount, Resources, RunAs, WorkloadSpec

# How long a runtime call about a replica (poll, stop, list, remove) may take; starts and log follows have
# their own, longer limits.
CALL_TIMEOUT = 30.0


class ReplicaIds(TypedDict):
    """The three numbers that name a replica in every report about it."""

    workload_id: int
    attempt: int
    replica: int


class NamesReplica(Protocol):
    """A message about one replica: a start's spec, a stop, a watch."""

    @property
    def node(self) -> str: ...
    @property
    def runtime(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def workload_id(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def replica(self) -> int: ...


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
    def from_message(cls, message: NamesReplica) -> ReplicaRef:
        """Return the replica `message` names."""
        return cls(
            node=message.node,
            runtime=message.runtime,
            name=message.name,
            workload_id=message.workload_id,
            attempt=message.attempt,
            replica=message.replica,
        )

    def ids(self) -> ReplicaIds:
        return {"workload_id": self.workload_id, "attempt": self.attempt, "replica": self.replica}


def driver_spec(spec: ReplicaSpec) -> WorkloadSpec:
    """Return the driver's `WorkloadSpec` for the controller's start `spec` (decoded and checked already);
    the runtime's `sandbox.check_sandbox` judges the values."""
    run_as = spec.run_as
    return WorkloadSpec(
        name=spec.name,
        workload_id=str(spec.workload_id),  # the driver names and labels by it
        tenant=spec.tenant,
        attempt=spec.attempt,
        image=spec.image,
        command=list(spec.command),
        env=dict(spec.env),
        gpu_uuids=list(spec.gpu_uuids),
        resources=Resources(**{name: getattr(spec, name) for name in RESOURCE_FIELDS}),
        replica=spec.replica,
        service_port=spec.service_port,
        service_port_env=spec.service_port_env,
        mounts=tuple(_mount(entry) for entry in spec.mounts),
        run_as=RunAs(run_as.uid, run_as.gid, tuple(run_as.groups)) if run_as is not None else None,
        workdir=spec.workdir,
        stop_signal=spec.stop_signal,
        gang_across_hosts=spec.gang_across_hosts,
        installation=spec.installation,
        node=spec.node,
    )


def _mount(entry: MountSpec) -> Mount:
    return Mount(
        source=entry.source,
        target=entry.target,
        read_only=entry.read_only,
        root=entry.root,
        marker=entry.marker,
        uid=entry.uid,
        gid=entry.gid,
        mode=entry.mode,
        subdirs=tuple(entry.subdirs),
    )
