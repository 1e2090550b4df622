"""Reconcile: compare the ledger with what the agents report, and repair both directions.

Periodically (`jobs.reconcile`) the controller repairs what it can see in
the ledger alone (allocations left behind, stops that were never
confirmed) and asks every live node's agent for the replicas its runtime
manages. Each agent answers with `jobs.node_replicas`, and
`reconcile_node` compares:

- a managed container the ledger does not run (no replica row, or an
  attempt that was stopped or superseded) is an orphan: it is stopped,
  removed and reported as a node event;
- a replica vanished only when the node itself says so: the request names
  the replicas whose start the ledger had heard of when it asked
  (`confirmed`), and the agent answers, from its own view after receiving
  the request, which of those its runtime no longer has (`gone`). Those are
  recorded as exited without a code, which fails or settles their workload
  like any exit. How late either message travelled does not matter;
- a replica the ledger is still launching that the node is not starting
  right now is started again, whether the runtime has nothing of it (its
  start message was lost, e.g. with a restarted broker) or has it (a start
  cut short: a container created but never started when the engine died,
  or a start report lost): starts are idempotent, and an agent adopts what
  exists, starts a created container and reports it;
- a replica whose start the ledger heard of and that runs on both sides is
  (re)watched by the agent from the last stored log cursor, so a restarted
  agent or console loses no output and still reports the exit.

A simulated node has no agent: its work runs in whichever controller
process takes the message, and each process knows only the simulated
workloads it started. Its answer cannot say a replica is gone (another
process may run it), nor that one it does not list lacks a watcher. A
simulated workload lives in its handle and the clock, so a running replica
whose watcher must be gone (it started before this controller process, or
its run should have ended a while ago and no exit came) is watched again
from the ledger's handle, and whichever process takes that follows it to
its end; one that another process still watches is left to it.

A replica whose stored output stops short of what its agent shipped lost a
log batch on the way (Redis's transport can lose the message a worker was
taking when it was killed, and a Redis restarted without persistence loses
every queued one). Its agent reads the output again from the stored cursor
(`request_output_resends`): when ingest sees a batch wait a second time for
its predecessor, and when the replica is over and its stored cursor is not
where its exit report says the output ends. An ended replica's container is
kept for that until `jobs.selectors.logs.OUTPUT_WAIT_WINDOW` after its end.

In the ledger alone, a workload placed (`scheduled`) whose launch never
happened (the launch message was lost with a restarted broker or console)
is launched again.
"""

from __future__ import annotations

import logging
import typing
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.utils import timezone

from common import control
from common.protocol.messages import ListReplicas, Runtime, StopReplica, WatchReplica
from inventory.choices import NodeState, RuntimeKind
from inventory.drivers.base import Ownership, PermanentDriverError
from inventory.drivers.simulated import SimulatedWorkload
from inventory.models import Node, NodeEvent
from inventory.services.installation import installation_id
from inventory.services.mounts import checkpoint_host_dirs
from jobs import dispatch
from jobs.choices import ACTIVE_STATES, WorkloadKind, WorkloadState
from jobs.models import Replica, ReplicaState, Workload
from jobs.selectors.logs import replicas_with_output_short
from jobs.services.execution import launch_workloads
from jobs.services.replicas import record_replica_exited
from jobs.services.stopping import (
    LIVE_REPLICA_STATES,
    dangling_allocations,
    grace_seconds,
    request_replica_stops,
    settle_workload,
    stale_stops,
    stop_message,
)

log = logging.getLogger(__name__)

# A placement younger than this may still have its launch message on the way.
RELAUNCH_AFTER = timedelta(seconds=10)
_LIVE_NODES = [NodeState.READY, NodeState.CORDONED, NodeState.DRAINING, NodeState.MAINTENANCE]
# An ended replica's output may be stored a little after its exit (another queue): only then is it short.
LOG_RESEND_AFTER = timedelta(seconds=5)
# One request to read a replica's output again per this many seconds, however often the gap is seen.
LOG_RESEND_SECONDS = 15
# A node is asked for its inventory again only once its last answer came, or after this long without one.
INVENTORY_ANSWER_WAIT_SECONDS = 300
_ASKED = "gpucloud:inventory-asked:{node}"
# A simulated replica's watcher reports its exit within this long after the run's end, or it is gone.
SIMULATED_EXIT_GRACE_SECONDS = 60.0


def reconcile_ledger(*, now: datetime | None = None) -> dict[str, int]:
    """Release allocations left behind, re-send stops the nodes never confirmed and launches that never
    happened; return counts."""
    moment = now or timezone.now()
    settled = sum(settle_workload(workload_id=pk) for pk in dangling_allocations())
    resent = 0
    for workload in stale_stops(now=moment):
        resent += request_replica_stops(workload)
        Workload.all_tenants.filter(pk=workload.pk).update(stop_requested_at=moment)
    # Placed before the evidence moment (`now`, see jobs.tasks) and still not launched: the pass's launch
    # message was taken and lost. Launched by the same batched messages a pass sends, not here, so a large
    # backlog costs this run one query.
    placed = Workload.all_tenants.filter(state=WorkloadState.SCHEDULED, scheduled_at__lt=moment - RELAUNCH_AFTER)
    relaunch = list(placed.values_list("pk", flat=True))
    dispatch.launch_on_commit(relaunch)
    short = replicas_with_output_short(moment).filter(finished_at__lt=moment - LOG_RESEND_AFTER)
    reread = request_output_resends(set(short.values_list("workload_id", "attempt", "index")))
    return {"released": settled, "stops_resent": resent, "relaunched": len(relaunch), "output_resent": reread}


def request_output_resends(keys: set[tuple[int, int, int]]) -> int:
    """Ask the nodes of these (workload id, attempt, replica index) to ship their output again from the
    stored cursor; return how many were asked.

    Idempotent and cheap to call often: a replica is asked at most once per
    LOG_RESEND_SECONDS, only while its node is live, its replica started and
    its output is not all stored (the agent re-reads the runtime's own log,
    running or ended; a replica already removed has nothing left to read).
    """
    asked = 0
    for workload_id, attempt, index in sorted(keys):
        replica = (
            Replica.all_tenants.filter(
                workload_id=workload_id,
                attempt=attempt,
                index=index,
                state__in=[ReplicaState.RUNNING, ReplicaState.EXITED],
                node__state__in=_LIVE_NODES,
            )
            .select_related("workload", "node")
            .first()
        )
        if replica is None or not replica.handle or replica.log_cursor == replica.log_end:
            continue  # nothing to read from, or all of its output is stored (what waits is a stale copy)
        if not cache.add(f"gpucloud:output-resend:{workload_id}:{attempt}:{index}", 1, LOG_RESEND_SECONDS):
            continue
        log.info("output of %s read again from %r: a log batch did not arrive", replica.name, replica.log_cursor)
        _watch(replica.node, replica, {}, resend=True)
        asked += 1
    return asked


def request_node_inventories() -> int:
    """Ask the agent of every live node for its own view of its replicas; return how many were asked.

    Each request names the replicas on that node whose start the ledger has
    heard of (`confirmed`): only those can the agent call gone; and those
    whose start was sent before this request (`launched`): only those are
    sent again, so a start still on its way is not sent twice.
    """
    nodes = list(Node.objects.filter(state__in=_LIVE_NODES).only("pk", "name", "runtime"))
    named: dict[str, dict[int, list[str]]] = {"confirmed": {}, "launched": {}}
    rows = Replica.all_tenants.filter(node__in=nodes, state__in=[ReplicaState.RUNNING, ReplicaState.LAUNCHING])
    for node_id, name, state in rows.values_list("node_id", "name", "state"):
        key = "confirmed" if state == ReplicaState.RUNNING else "launched"
        named[key].setdefault(node_id, []).append(name)
    asked = 0
    for node in nodes:
        if not _ask(node):
            continue
        asked += 1
        asking = ListReplicas(
            node=node.name,
            runtime=_runtime(node),
            installation=installation_id(),
            confirmed=sorted(named["confirmed"].get(node.pk, [])),
            launched=sorted(named["launched"].get(node.pk, [])),
        )
        dispatch.send_message(asking, queue=node.agent_queue)
    return asked


def _ask(node: Node) -> bool:
    """Claim the node's one outstanding inventory question; False while an earlier one waits for its answer.

    A controller that fell behind would otherwise queue a question for every
    node every period, each answer costing it more of the time it lacks; an
    answer lost on the way is asked again once the claim expires. Without a
    cache, every period asks.
    """
    try:
        return bool(cache.add(_ASKED.format(node=node.pk), 1, INVENTORY_ANSWER_WAIT_SECONDS))
    except Exception:
        log.warning("inventory question marker unavailable; asking %s anyway", node.name, exc_info=True)
        return True


def _answered(node: Node) -> None:
    try:
        cache.delete(_ASKED.format(node=node.pk))
    except Exception:
        log.warning("could not clear the inventory question marker of %s", node.name, exc_info=True)


def reconcile_node(
    *,
    node: str,
    managed: list[dict[str, Any]],
    starting: list[str] | None = None,
    gone: list[str] | None = None,
    unstarted: list[str] | None = None,
) -> dict[str, int]:
    """Compare the node's own view with the ledger; return counts of orphans, vanished, watched, restarted.

    `managed` is the agent's runtime list (name, workload_id, attempt,
    replica, state, handle), `starting` the replicas it is starting now,
    `gone` the confirmed replicas its runtime no longer has (see the module
    docstring), `unstarted` those launched before the question that it is
    not starting (None from an agent that predates it: every launching
    replica it is not starting).
    Idempotent: a late or repeated answer changes nothing new.
    """
    row = Node.objects.filter(name=node).first()
    counts = {"orphans": 0, "vanished": 0, "watched": 0, "restarted": 0}
    if row is None:
        return counts
    _answered(row)
    ledger = {
        replica.name: replica
        for replica in Replica.all_tenants.filter(node=row)
        .exclude(state=ReplicaState.LOST)
        .select_related("workload__pool", "node")
    }
    simulated = row.runtime == RuntimeKind.SIMULATED
    managed = [item for item in managed if _owner(item, row) != Ownership.FOREIGN]
    for item in managed:
        replica = ledger.get(str(item.get("name")))
        if replica is None or not _wanted(replica):
            counts["orphans"] += _stop_orphan(row, item, replica)
        elif replica.state == ReplicaState.RUNNING and not simulated:
            _watch(row, replica, item)
            counts["watched"] += 1
    present = {str(item.get("name")) for item in managed} | set(starting or [])
    if simulated:
        gone = []
        moment = control.evidence_time()
        for name, replica in ledger.items():
            if name not in present and replica.state == ReplicaState.RUNNING and _unwatched(replica, moment):
                _watch(row, replica, {})
                counts["watched"] += 1
    for name in sorted(set(gone or []) - present):
        replica = ledger.get(name)
        # Only a start the ledger had heard of can be gone; a launching replica is sent again below.
        if replica is not None and replica.state == ReplicaState.RUNNING:
            counts["vanished"] += record_replica_exited(
                workload_id=replica.workload_id,
                attempt=replica.attempt,
                replica=replica.index,
                exit_code=None,
                message=f"Its container vanished from node {node}.",
            )
    # A replica still launching that the agent is not starting right now is started again, whether the
    # runtime has nothing of it (its start message was lost) or has it (a start cut short, e.g. a
    # container created but never started when the engine died): the start adopts what exists, starts a
    # created container, and reports it. Watching it instead would leave a never-started one running.
    # Only a start sent before the question can be missing from the answer: one sent after it may still be
    # on its way (a queue behind), and sending it again would only lengthen that queue.
    candidates = set(unstarted) if unstarted is not None else set(ledger) - set(starting or [])
    unsent = [
        replica.workload_id
        for name, replica in ledger.items()
        if name in candidates and replica.state == ReplicaState.LAUNCHING and _wanted(replica)
    ]
    counts["restarted"] = launch_workloads(workload_ids=unsent, resend=True) if unsent else 0
    return counts


def _unwatched(replica: Replica, moment: datetime) -> bool:
    """Whether a running simulated replica's watcher is gone: it started before this controller process (a
    restart), or its run should have ended by `moment` and its exit was never reported (its process died).

    A simulated replica that another live process watches is left to it: watching it twice would report
    its output and exit twice.
    """
    try:
        ends_at = SimulatedWorkload.from_handle(replica.handle).ends_at
    except PermanentDriverError:
        return False
    restarted = replica.started_at is not None and replica.started_at < control.watching_since()
    return restarted or ends_at + SIMULATED_EXIT_GRACE_SECONDS < moment.timestamp()


def _wanted(replica: Replica) -> bool:
    """Return whether the ledger still wants `replica` to run (current attempt of an active workload)."""
    workload = replica.workload
    return workload.attempt == replica.attempt and workload.state in ACTIVE_STATES


def _owner(item: dict[str, Any], node: Node) -> Ownership:
    """Return whether the listed `item` is this installation's `node`'s, another's, or records no owner."""
    installation, owner_node = str(item.get("installation") or ""), str(item.get("node") or "")
    if not installation or not owner_node:
        return Ownership.LEGACY
    return Ownership.OWN if (installation, owner_node) == (installation_id(), node.name) else Ownership.FOREIGN


def _stop_orphan(node: Node, item: dict[str, Any], replica: Replica | None) -> int:
    """Stop and remove a container the ledger does not run; report it once (when it still runs).

    Only one this installation started for `node`: a container that records
    no owner (started before owners were recorded) may be another
    console's or node's, so it is left running and logged for an operator.
    """
    if _owner(item, node) is not Ownership.OWN:
        log.warning(
            "%s on %s records no owning installation and node: left alone (remove it by hand if it is stale)",
            item.get("name"),
            node.name,
        )
        return 0
    if replica is not None and replica.state not in LIVE_REPLICA_STATES and item.get("state") != "running":
        # Known and already over: only its leftovers are removed, once its output is stored (or too old).
        if replicas_with_output_short(timezone.now()).filter(pk=replica.pk).exists():
            return 0
        dispatch.send_message(stop_message(replica, 0, ended=True), queue=node.agent_queue)
        return 0
    if not str(item.get("workload_id")).isdigit():
        log.warning("%s on %s names no workload id a stop can carry: left alone", item.get("name"), node.name)
        return 0
    grace = grace_seconds(replica.workload) if replica is not None else 0
    message = StopReplica(
        node=node.name,
        installation=installation_id(),
        runtime=_runtime(node),
        name=str(item.get("name")),
        handle=item.get("handle") or {},
        # The node reports the driver's string id; a stop names the replica as every other message does.
        workload_id=int(item["workload_id"]),
        attempt=int(item["attempt"]),
        replica=int(item["replica"]),
        grace_seconds=grace,
        remove=True,
    )
    dispatch.send_message(message, queue=node.agent_queue)
    NodeEvent.objects.create(
        node=node,
        kind="node.orphan_stopped",
        message=f"Stopped {item.get('name')}: the ledger does not run it.",
        data={"name": item.get("name"), "workload_id": item.get("workload_id"), "attempt": item.get("attempt")},
    )
    log.info("orphan %s on %s stopped", item.get("name"), node.name)
    return 1


def _watch(node: Node, replica: Replica, item: dict[str, Any], *, resend: bool = False) -> None:
    """Have the node follow `replica` from its stored log cursor (`resend`: replacing its current watcher)."""
    handle = replica.handle or item.get("handle") or {}
    ready_path, secret = _readiness(replica)
    message = WatchReplica(
        node=node.name,
        runtime=_runtime(node),
        name=replica.name,
        handle=handle,
        workload_id=replica.workload_id,
        attempt=replica.attempt,
        replica=replica.index,
        log_cursor=replica.log_cursor,
        report_start=False,  # the ledger heard of its start; only a new watcher reports it again
        resend=resend,
        checkpoint_dir=_checkpoint_dir(replica),
        ready_path=ready_path,
        secret=secret,
    )
    dispatch.send_message(message, queue=node.agent_queue)


def _runtime(node: Node) -> Runtime:
    """Return the node's runtime as the protocol names it (the same three values as `RuntimeKind`)."""
    return typing.cast(Runtime, node.runtime)


def _checkpoint_dir(replica: Replica) -> str:
    """Return where the node finds a job's checkpoint directory when it watches the job's first replica, else ""."""
    workload = replica.workload
    if workload.kind != WorkloadKind.JOB or replica.index != 0:
        return ""
    return checkpoint_host_dirs([(workload.pk, workload.project_id)], console=False).get(workload.pk, "")


def _readiness(replica: Replica) -> tuple[str, str]:
    """Return the readiness check (path, secret) a re-watched notebook still needs (none once Jupyter answered)."""
    workload = replica.workload
    if workload.kind != WorkloadKind.NOTEBOOK or replica.index != 0 or replica.ready_at is not None:
        return "", ""
    return f"/notebooks/{workload.pk}/api/status", workload.session_secret
