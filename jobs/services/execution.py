"""Launching placed workloads on their nodes.

`launch_workloads` is what the controller runs after a scheduling pass
commits placements: each workload still `scheduled` moves to `starting`
(compare-and-swap), gets one `Replica` row per replica with a deterministic
name, and each replica's spec goes to its node's agent. A retried launch of
a workload already `starting` in the same attempt sends the replicas that
have not reported yet again; the agent adopts what an earlier try created.

Specs are plain JSON: the agent rebuilds the driver's `WorkloadSpec` from
them (see `inventory.agent.executor`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction

from inventory.choices import RuntimeKind
from inventory.models import Node
from inventory.services import mounts
from jobs import dispatch
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Allocation, Replica, ReplicaState, Workload
from jobs.services.lifecycle import transition_workload

# torchrun's default rendezvous port; each container has its own network namespace.
MASTER_PORT = 29500
# Process-runtime gangs share the host's ports: each workload gets its own from this range, kept below Linux's
# ephemeral ports (32768 and up by default), which any outgoing connection of the host may hold at the time.
_PROCESS_PORT_BASE, _PROCESS_PORT_SPAN = 20000, 12000


@dataclass
class _Placement:
    """Where one replica runs: its node and the UUIDs of its GPUs, in allocation order."""

    node: Node
    gpu_uuids: list[str] = field(default_factory=list)


def container_name(workload_id: int, replica: int, attempt: int) -> str:
    """Return the deterministic name of one replica of one attempt (the runtimes' naming rule)."""
    return f"gpucloud-w{workload_id}-r{replica}-a{attempt}"


def launch_workloads(*, workload_ids: Iterable[int]) -> int:
    """Launch each of `workload_ids` that is `scheduled` (or re-send a `starting` one); return how many were sent.

    Workloads in any other state are skipped: they were cancelled or
    preempted after placement, and their allocations are the stop path's.
    """
    sent = 0
    launching = Workload.all_tenants.filter(pk__in=list(workload_ids)).select_related("tenant", "owner", "project")
    for workload in launching.order_by("pk"):
        if workload.state in (WorkloadState.SCHEDULED, WorkloadState.STARTING):
            sent += launch_workload(workload=workload)
    return sent


@transaction.atomic
def launch_workload(*, workload: Workload) -> int:
    """Move `workload` to `starting` and send its replicas that have not started to their nodes; return the count.

    Idempotent per attempt: the Replica rows are unique per (workload,
    attempt, replica), and container names derive from them.
    """
    placements = _placements(workload.pk)
    if not placements:
        return 0
    if workload.state == WorkloadState.SCHEDULED:
        secret = secrets.token_urlsafe(32) if workload.service_port else ""
        if not transition_workload(
            workload_id=workload.pk,
            from_states=[WorkloadState.SCHEDULED],
            to_state=WorkloadState.STARTING,
            message=f"Starting {len(placements)} replica{'s' if len(placements) != 1 else ''}.",
            session_secret=secret,
            idle_warned_at=None,
            idle_extended_at=None,
            stop_requested_at=None,
        ):
            return 0
        workload.refresh_from_db()
    replicas = _replica_rows(workload, placements)
    pending = [row for row in replicas if row.state == ReplicaState.LAUNCHING]
    storage = workload_storage(workload) if pending else None
    for row in pending:
        spec = replica_spec(workload, row.index, placements, storage)
        dispatch.send_on_commit(dispatch.START_REPLICA, queue=row.node.agent_queue, kwargs={"spec": spec})
    return len(pending)


def _placements(workload_id: int) -> dict[int, _Placement]:
    """Return {replica: placement} from the workload's active allocations (GPU order kept)."""
    placements: dict[int, _Placement] = {}
    allocations = (
        Allocation.all_tenants.filter(workload_id=workload_id, released_at__isnull=True)
        .select_related("node", "gpu")
        .order_by("replica", "gpu__index", "id")
    )
    for allocation in allocations:
        placement = placements.setdefault(allocation.replica, _Placement(allocation.node))
        if allocation.gpu is not None:
            placement.gpu_uuids.append(allocation.gpu.uuid)
    return placements


def _replica_rows(workload: Workload, placements: dict[int, _Placement]) -> list[Replica]:
    existing = {row.index: row for row in Replica.all_tenants.filter(workload=workload, attempt=workload.attempt)}
    missing = [
        Replica(
            tenant_id=workload.tenant_id,
            workload=workload,
            attempt=workload.attempt,
            index=index,
            node=placement.node,
            name=container_name(workload.pk, index, workload.attempt),
        )
        for index, placement in sorted(placements.items())
        if index not in existing
    ]
    Replica.all_tenants.bulk_create(missing, ignore_conflicts=True)
    return list(
        Replica.all_tenants.filter(workload=workload, attempt=workload.attempt).select_related("node").order_by("index")
    )


@dataclass(frozen=True)
class WorkloadStorage:
    """What every replica of a workload mounts, as whom, and the variables that say where."""

    mounts: list[dict[str, Any]]
    run_as: dict[str, Any]
    workdir: str
    env: dict[str, str]


def workload_storage(workload: Workload) -> WorkloadStorage:
    """Return the volumes `workload` mounts (its owner's home first) and the storage variables of its replicas.

    `HOME` and the working directory are the home; `GPUCLOUD_CHECKPOINT_DIR`
    is on the project's own volume and the same for every attempt, so a
    requeued job finds what the previous attempt saved.
    """
    planned = mounts.plan_mounts(tenant=workload.tenant, owner=workload.owner, project=workload.project)
    home = planned[0].target
    env = {
        "HOME": home,
        "GPUCLOUD_HOME": home,
        "GPUCLOUD_PROJECT_DIR": mounts.project_dir(planned),
        "GPUCLOUD_CHECKPOINT_DIR": mounts.checkpoint_dir(planned, workload.pk),
    }
    return WorkloadStorage(
        mounts=mounts.mount_specs(planned, workload.pk),
        run_as=mounts.run_as(planned, workload.owner, workload.project),
        workdir=home,
        env=env,
    )


def replica_spec(
    workload: Workload, index: int, placements: dict[int, _Placement], storage: WorkloadStorage | None = None
) -> dict[str, Any]:
    """Return the JSON spec of replica `index` of `workload`'s current attempt, as the agent's `start_replica` takes."""
    placement = placements[index]
    runtime = placement.node.runtime
    notebook = workload.kind == WorkloadKind.NOTEBOOK
    watches_checkpoints = not notebook and index == 0
    storage = storage if storage is not None else workload_storage(workload)
    env = {**workload.env, **storage.env, **_gang_env(workload, index, placements), **_identity_env(workload, index)}
    if notebook:
        env["JUPYTER_TOKEN"] = workload.session_secret
    return {
        "node": placement.node.name,
        "name": container_name(workload.pk, index, workload.attempt),
        "workload_id": str(workload.pk),
        "tenant": workload.tenant.slug,
        "attempt": workload.attempt,
        "replica": index,
        "runtime": runtime,
        "image": workload.image,
        "command": _command(workload, runtime),
        "env": env,
        "gpu_uuids": placement.gpu_uuids,
        "cpus": workload.cpu_milli / 1000,
        "memory_mb": workload.memory_mib,
        "service_port": workload.service_port if index == 0 else None,
        "service_port_env": ("JUPYTER_PORT" if notebook else "PORT") if workload.service_port else "",
        # The agent holds a notebook in `starting` until Jupyter answers here (with the session's token).
        "ready_path": f"/notebooks/{workload.pk}/api/status" if notebook and index == 0 else "",
        "secret": workload.session_secret if notebook else "",
        "mounts": storage.mounts,
        "run_as": storage.run_as,
        "workdir": storage.workdir,
        "stop_signal": workload.stop_signal,
        # Docker replicas of a gang on several nodes share an overlay network of their own (docs/gangs.md).
        "gang_across_hosts": runtime == RuntimeKind.DOCKER and len({p.node.pk for p in placements.values()}) > 1,
        # A job's first replica has its node report the checkpoints it sees there (inventory.agent.checkpoints).
        "checkpoint_dir": mounts.checkpoint_node_dir(storage.mounts, workload.pk) if watches_checkpoints else "",
    }


def _identity_env(workload: Workload, index: int) -> dict[str, str]:
    return {
        "GPUCLOUD_WORKLOAD_ID": str(workload.pk),
        "GPUCLOUD_ATTEMPT": str(workload.attempt),
        "GPUCLOUD_REPLICA": str(index),
        "GPUCLOUD_TENANT": workload.tenant.slug,
    }


def _gang_env(workload: Workload, index: int, placements: dict[int, _Placement]) -> dict[str, str]:
    """Return torchrun's variables for replica `index`: one process per replica, rank 0 the rendezvous master."""
    master = placements[0].node
    same_node = [i for i in sorted(placements) if placements[i].node.pk == placements[index].node.pk]
    return {
        "RANK": str(index),
        "NODE_RANK": str(index),
        "LOCAL_RANK": str(same_node.index(index)),
        "WORLD_SIZE": str(len(placements)),
        "MASTER_ADDR": _master_addr(workload, placements, master),
        "MASTER_PORT": str(_master_port(workload, master)),
    }


def _master_addr(workload: Workload, placements: dict[int, _Placement], master: Node) -> str:
    """Where replica 0 is reached from the others.

    Docker replicas find replica 0 by its container name: on one node in
    the tenant's bridge network, across nodes in the gang's own overlay
    network (docs/gangs.md), whose DNS resolves it. Processes on one host
    use loopback; across nodes, replica 0's node address.
    """
    if master.runtime == RuntimeKind.DOCKER:
        return container_name(workload.pk, 0, workload.attempt)
    if all(p.node.pk == master.pk for p in placements.values()):
        return "127.0.0.1"
    return master.address or master.name


def _master_port(workload: Workload, master: Node) -> int:
    if master.runtime == RuntimeKind.PROCESS:
        return _PROCESS_PORT_BASE + (workload.pk * 31 + workload.attempt) % _PROCESS_PORT_SPAN
    return MASTER_PORT


def _command(workload: Workload, runtime: str) -> list[str]:
    """Return the replica's command: the workload's own, or for a notebook without one, the Jupyter server's."""
    if workload.command or workload.kind != WorkloadKind.NOTEBOOK:
        return list(workload.command)
    # Inside a container Jupyter must listen on every interface of its namespace (the port is published);
    # a process shares the host and listens on loopback only.
    ip = "127.0.0.1" if runtime == RuntimeKind.PROCESS else "0.0.0.0"  # noqa: S104 -- the container's own namespace
    # A process runs as the agent's user, which may be root on a development host; containers never do.
    root = ["--ServerApp.allow_root=True"] if runtime == RuntimeKind.PROCESS else []
    return [
        *settings.NOTEBOOK_COMMAND,
        f"--ServerApp.base_url=/notebooks/{workload.pk}/",
        f"--ServerApp.ip={ip}",
        "--no-browser",
        "--ServerApp.allow_remote_access=True",
        # The runtime chose the port (JUPYTER_PORT) and the proxy goes there: never drift to another one.
        "--ServerApp.port_retries=0",
        *root,
    ]
