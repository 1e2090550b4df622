"""Reconcile: compare the ledger with what the agents report, and repair both directions.

Periodically (`jobs.reconcile`) the controller repairs what it can see in
the ledger alone (allocations left behind, stops that were never
confirmed) and asks every live node's agent for the replicas its runtime
manages. Each agent answers with `jobs.node_replicas`, and
`reconcile_node` compares:

- a managed container the ledger does not run (no replica row, or an
  attempt that was stopped or superseded) is an orphan: it is stopped,
  removed and reported as a node event;
- a replica the ledger runs on that node with no container (and launched
  long enough ago not to race its own start) vanished: it is recorded as
  exited, which fails or settles its workload like any exit;
- a replica that runs on both sides is (re)watched by the agent from the
  last stored log cursor, so a restarted agent or console loses no output
  and still reports the exit.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from inventory.choices import NodeState
from inventory.models import Node, NodeEvent
from jobs import dispatch
from jobs.choices import ACTIVE_STATES, WorkloadKind
from jobs.models import Replica, ReplicaState, Workload
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

# A replica launched less than this long ago may simply not have been created yet.
LAUNCH_GRACE = timedelta(seconds=60)
_LIVE_NODES = [NodeState.READY, NodeState.CORDONED, NodeState.DRAINING, NodeState.MAINTENANCE]


def reconcile_ledger(*, now: datetime | None = None) -> dict[str, int]:
    """Release allocations left behind and re-send stops the nodes never confirmed; return counts."""
    moment = now or timezone.now()
    settled = sum(settle_workload(workload_id=pk) for pk in dangling_allocations())
    resent = 0
    for workload in stale_stops(now=moment):
        resent += request_replica_stops(workload)
        Workload.all_tenants.filter(pk=workload.pk).update(stop_requested_at=moment)
    return {"released": settled, "stops_resent": resent}


def request_node_inventories() -> int:
    """Ask the agent of every live node for the replicas its runtime manages; return how many were asked."""
    nodes = list(Node.objects.filter(state__in=_LIVE_NODES).only("name", "runtime"))
    for node in nodes:
        dispatch.send(
            dispatch.LIST_REPLICAS, queue=node.agent_queue, kwargs={"node": node.name, "runtime": node.runtime}
        )
    return len(nodes)


def reconcile_node(*, node: str, managed: list[dict[str, Any]], now: datetime | None = None) -> dict[str, int]:
    """Compare `managed` (the agent's list: name, workload_id, attempt, replica, state, handle) with the ledger.

    Returns counts of orphans stopped, vanished replicas recorded and
    replicas re-watched.
    """
    moment = now or timezone.now()
    row = Node.objects.filter(name=node).first()
    if row is None:
        return {"orphans": 0, "vanished": 0, "watched": 0}
    ledger = {
        replica.name: replica
        for replica in Replica.all_tenants.filter(node=row)
        .exclude(state=ReplicaState.LOST)
        .select_related("workload__pool", "node")
    }
    seen = {str(item.get("name")) for item in managed}
    counts = {"orphans": 0, "vanished": 0, "watched": 0}
    for item in managed:
        replica = ledger.get(str(item.get("name")))
        if replica is None or not _wanted(replica):
            counts["orphans"] += _stop_orphan(row, item, replica)
        elif replica.state in LIVE_REPLICA_STATES:
            _watch(row, replica, item)
            counts["watched"] += 1
    for name, replica in ledger.items():
        if name not in seen and replica.state in LIVE_REPLICA_STATES and moment - replica.created_at > LAUNCH_GRACE:
            counts["vanished"] += record_replica_exited(
                workload_id=replica.workload_id,
                attempt=replica.attempt,
                replica=replica.index,
                exit_code=None,
                message=f"Its container vanished from node {node}.",
                launch_failed=replica.state == ReplicaState.LAUNCHING,
            )
    return counts


def _wanted(replica: Replica) -> bool:
    """Return whether the ledger still wants `replica` to run (current attempt of an active workload)."""
    workload = replica.workload
    return workload.attempt == replica.attempt and workload.state in ACTIVE_STATES


def _stop_orphan(node: Node, item: dict[str, Any], replica: Replica | None) -> int:
    """Stop and remove a container the ledger does not run; report it once (when it still runs)."""
    if replica is not None and replica.state not in LIVE_REPLICA_STATES and item.get("state") != "running":
        # Known and already over: only its leftovers are removed.
        dispatch.send(dispatch.STOP_REPLICA, queue=node.agent_queue, kwargs=stop_message(replica, 0))
        return 0
    grace = grace_seconds(replica.workload) if replica is not None else 0
    message = {
        "node": node.name,
        "runtime": node.runtime,
        "name": str(item.get("name")),
        "handle": item.get("handle") or {},
        "workload_id": item.get("workload_id"),
        "attempt": item.get("attempt"),
        "replica": item.get("replica"),
        "grace_seconds": grace,
        "remove": True,
    }
    dispatch.send(dispatch.STOP_REPLICA, queue=node.agent_queue, kwargs=message)
    NodeEvent.objects.create(
        node=node,
        kind="node.orphan_stopped",
        message=f"Stopped {item.get('name')}: the ledger does not run it.",
        data={"name": item.get("name"), "workload_id": item.get("workload_id"), "attempt": item.get("attempt")},
    )
    log.info("orphan %s on %s stopped", item.get("name"), node.name)
    return 1


def _watch(node: Node, replica: Replica, item: dict[str, Any]) -> None:
    handle = replica.handle or item.get("handle") or {}
    dispatch.send(
        dispatch.WATCH_REPLICA,
        queue=node.agent_queue,
        kwargs={
            "node": node.name,
            "runtime": node.runtime,
            "name": replica.name,
            "handle": handle,
            "workload_id": replica.workload_id,
            "attempt": replica.attempt,
            "replica": replica.index,
            "log_cursor": replica.log_cursor,
            **_readiness(replica),
        },
    )


def _readiness(replica: Replica) -> dict[str, str]:
    """Return the readiness check a re-watched notebook still needs (none once Jupyter answered)."""
    workload = replica.workload
    if workload.kind != WorkloadKind.NOTEBOOK or replica.index != 0 or replica.ready_at is not None:
        return {"ready_path": "", "secret": ""}
    return {"ready_path": f"/notebooks/{workload.pk}/api/status", "secret": workload.session_secret}
