"""Launching placed workloads on their nodes.

`launch_workloads` is what the controller runs after a scheduling pass
commits placements: each workload still `scheduled` moves to `starting`
(compare-and-swap), gets one `Replica` row per replica with a deterministic
name, and each replica's spec goes to its node's agent. Reconcile asks for
the replicas of a workload already `starting` to be sent again (`resend`)
once their node says it is not starting them; the agent adopts what an
earlier try created.

Specs are plain JSON: the agent rebuilds the driver's `WorkloadSpec` from
them (see `inventory.agent.executor`).
"""

from __future__ import annotations

import logging
import secrets
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction

from common.protocol.messages import (
    RESOURCE_FIELDS,
    MountSpec,
    ReplicaSpec,
    RunAsSpec,
    Runtime,
    StartReplica,
    StopSignal,
)
from inventory.choices import RuntimeKind
from inventory.drivers import policy
from inventory.models import Node
from inventory.services import mounts
from inventory.services.installation import installation_id
from jobs import dispatch
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Allocation, Replica, ReplicaState, Workload
from jobs.services.lifecycle import transition_workloads

log = logging.getLogger(__name__)

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
    """Return the deterministic name of one replica of one attempt of this console (`policy.container_name`)."""
    return policy.container_name(installation_id(), workload_id, replica, attempt)


def launch_workloads(*, workload_ids: Iterable[int], resend: bool = False) -> int:
    """Launch each of `workload_ids` that is `scheduled`; return how many replica starts were sent.

    With `resend`, a `starting` one's replicas that have not reported are
    sent again too (reconcile, once their node said it is not starting
    them). Without it a `starting` workload is skipped: a second launch
    message (a placement launched by reconcile while the pass's own launch
    waited in the queue) must not send every start twice. Workloads in any
    other state are skipped: they were cancelled or preempted after
    placement, and their allocations are the stop path's.

    The batch is launched in one transaction with a fixed number of queries
    (a pass places thousands at once). If it fails for anything but the
    database, each workload is launched on its own, so one that cannot be
    launched (left `scheduled` for reconcile and the start timeout) does
    not hold back the rest.
    """
    ids = sorted({int(pk) for pk in workload_ids})
    if not ids:
        return 0
    try:
        return _launch(ids, resend=resend)
    except DatabaseError:
        raise  # the task retries the whole batch once the database answers
    except Exception:
        if len(ids) == 1:
            raise
        log.warning("launching %d workloads at once failed; launching them one by one", len(ids), exc_info=True)
    sent = 0
    for pk in ids:
        try:
            sent += _launch([pk], resend=resend)
        except DatabaseError:
            raise
        except Exception:
            log.exception("could not launch workload %s; reconcile tries again", pk)
    return sent


def launch_workload(*, workload: Workload) -> int:
    """Move `workload` to `starting` (or, already `starting`, re-send it) and send its replicas that have not
    started to their nodes; return the count. Idempotent per attempt: the Replica rows are unique per
    (workload, attempt, replica), and container names derive from them."""
    return _launch([workload.pk], resend=True)


@transaction.atomic
def _launch(ids: list[int], *, resend: bool) -> int:
    states = [WorkloadState.SCHEDULED, WorkloadState.STARTING] if resend else [WorkloadState.SCHEDULED]
    found = dict(Workload.all_tenants.filter(pk__in=ids, state__in=states).values_list("pk", "state"))
    placements = _placements_of(list(found))
    placed = {
        pk: len(placements[pk]) for pk, state in found.items() if state == WorkloadState.SCHEDULED and pk in placements
    }
    moved = transition_workloads(
        workload_ids=placed,
        from_states=[WorkloadState.SCHEDULED],
        to_state=WorkloadState.STARTING,
        messages={pk: f"Starting {n} replica{'s' if n != 1 else ''}." for pk, n in placed.items()},
        session_secret="",
        idle_warned_at=None,
        idle_extended_at=None,
        stop_requested_at=None,
    )
    resent = [pk for pk, state in found.items() if state == WorkloadState.STARTING and pk in placements]
    launching = list(
        Workload.all_tenants.filter(pk__in=[*moved, *resent])
        .select_related("tenant", "owner", "project")
        .order_by("pk")
    )
    for workload in launching:
        if workload.pk in moved and workload.service_port:
            # Each notebook's session secret is its own: the few there are get one update each.
            workload.session_secret = secrets.token_urlsafe(32)
            Workload.all_tenants.filter(pk=workload.pk).update(session_secret=workload.session_secret)
    pending = _pending_replicas(launching, placements)
    plans: dict[tuple[int, int], list[mounts.PlannedMount]] = {}
    sent = 0
    for workload in launching:
        rows = pending.get(workload.pk, [])
        if not rows:
            continue
        key = (workload.owner_id, workload.project_id)
        if key not in plans:
            plans[key] = mounts.plan_mounts(tenant=workload.tenant, owner=workload.owner, project=workload.project)
        storage = _storage(workload, plans[key])
        for row in rows:
            spec = replica_spec(workload, row.index, placements[workload.pk], storage)
            dispatch.message_on_commit(StartReplica(spec=spec), queue=row.node.agent_queue)
            sent += 1
    return sent


def _placements(workload_id: int) -> dict[int, _Placement]:
    """Return {replica: placement} from the workload's active allocations (GPU order kept)."""
    return _placements_of([workload_id]).get(workload_id, {})


def _placements_of(workload_ids: list[int]) -> dict[int, dict[int, _Placement]]:
    """Return {workload id: {replica: placement}} from the active allocations of `workload_ids` (one query)."""
    placements: dict[int, dict[int, _Placement]] = {}
    allocations = (
        Allocation.all_tenants.filter(workload_id__in=workload_ids, released_at__isnull=True)
        .select_related("node", "gpu")
        .order_by("workload_id", "replica", "gpu__index", "id")
    )
    for allocation in allocations:
        replicas = placements.setdefault(allocation.workload_id, {})
        placement = replicas.setdefault(allocation.replica, _Placement(allocation.node))
        if allocation.gpu is not None:
            placement.gpu_uuids.append(allocation.gpu.uuid)
    return placements


def _pending_replicas(
    workloads: list[Workload], placements: dict[int, dict[int, _Placement]]
) -> dict[int, list[Replica]]:
    """Make the missing Replica rows of each workload's current attempt; return {workload id: rows still
    launching, by index} (two queries for the whole batch)."""
    attempts = {workload.pk: workload.attempt for workload in workloads}
    missing = [
        Replica(
            tenant_id=workload.tenant_id,
            workload=workload,
            attempt=workload.attempt,
            index=index,
            node=placement.node,
            name=container_name(workload.pk, index, workload.attempt),
        )
        for workload in workloads
        for index, placement in sorted(placements[workload.pk].items())
    ]
    # Rows an earlier try made already are kept as they are (unique per workload, attempt and index).
    Replica.all_tenants.bulk_create(missing, ignore_conflicts=True)
    pending: dict[int, list[Replica]] = {}
    rows = Replica.all_tenants.filter(workload_id__in=list(attempts), state=ReplicaState.LAUNCHING).select_related(
        "node"
    )
    for row in rows.order_by("workload_id", "index"):
        if row.attempt == attempts[row.workload_id]:
            pending.setdefault(row.workload_id, []).append(row)
    return pending


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
    return _storage(
        workload, mounts.plan_mounts(tenant=workload.tenant, owner=workload.owner, project=workload.project)
    )


def _storage(workload: Workload, planned: list[mounts.PlannedMount]) -> WorkloadStorage:
    """Return `workload_storage` from the mounts planned for its owner and project (shared by a batch)."""
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
) -> ReplicaSpec:
    """Return the spec of replica `index` of `workload`'s current attempt, as the agent's `StartReplica` carries it."""
    placement = placements[index]
    runtime = placement.node.runtime
    notebook = workload.kind == WorkloadKind.NOTEBOOK
    watches_checkpoints = not notebook and index == 0
    storage = storage if storage is not None else workload_storage(workload)
    env = {**workload.env, **storage.env, **_gang_env(workload, index, placements), **_identity_env(workload, index)}
    if notebook:
        env["JUPYTER_TOKEN"] = workload.session_secret
    return ReplicaSpec(
        node=placement.node.name,
        # With the node, whose the replica is: reconcile on a shared engine touches only its own.
        installation=installation_id(),
        name=container_name(workload.pk, index, workload.attempt),
        workload_id=workload.pk,
        tenant=workload.tenant.slug,
        attempt=workload.attempt,
        replica=index,
        runtime=typing.cast(Runtime, runtime),
        image=workload.image,
        command=_command(workload, runtime),
        env=env,
        gpu_uuids=placement.gpu_uuids,
        **{name: getattr(workload, name) for name in RESOURCE_FIELDS},
        service_port=workload.service_port if index == 0 else None,
        service_port_env=("JUPYTER_PORT" if notebook else "PORT") if workload.service_port else "",
        # The agent holds a notebook in `starting` until Jupyter answers here (with the session's token).
        ready_path=f"/notebooks/{workload.pk}/api/status" if notebook and index == 0 else "",
        secret=workload.session_secret if notebook else "",
        mounts=[MountSpec(**mount) for mount in storage.mounts],
        run_as=RunAsSpec(**storage.run_as),
        workdir=storage.workdir,
        stop_signal=typing.cast(StopSignal, workload.stop_signal),
        # Docker replicas of a gang on several nodes share an overlay network of their own (docs/gangs.md).
        gang_across_hosts=runtime == RuntimeKind.DOCKER and len({p.node.pk for p in placements.values()}) > 1,
        # A job's first replica has its node report the checkpoints it sees there (inventory.agent.checkpoints).
        checkpoint_dir=mounts.checkpoint_node_dir(storage.mounts, workload.pk) if watches_checkpoints else "",
    )


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
