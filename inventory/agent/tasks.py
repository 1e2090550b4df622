"""Tasks the agent runs on its node's queue (`node.<name>`); simulated nodes' run on `control`.

Each decodes its message (`common.protocol.messages`, checked against the
version its Celery message names: `common.control.decode`) before acting: a
message that does not fit raises `ProtocolError`, naming every bad field,
and nothing is done.
"""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from common.control import decode
from common.protocol.messages import ListReplicas, NodeReplicas, ProbeNode, StartReplica, StopReplica, WatchReplica
from inventory.agent.config import active_config
from inventory.agent.egress import keep_egress
from inventory.agent.executor import executor
from inventory.agent.probe import probe_node as run_probe
from inventory.drivers.base import TransientDriverError


@shared_task(name=ProbeNode.TASK)
def probe_node(request: dict[str, Any]) -> dict[str, Any]:
    """Probe this node for provisioning; return the report (never raises, errors are in the report)."""
    return run_probe(decode(ProbeNode, {"request": request}).request, active_config())


@shared_task(name=StartReplica.TASK, ignore_result=True)
def start_replica(spec: dict[str, Any]) -> None:
    """Start or adopt one replica and watch it (reports go to the controller)."""
    executor().start(decode(StartReplica, {"spec": spec}).spec)


@shared_task(name=StopReplica.TASK, ignore_result=True)
def stop_replica(**message: Any) -> None:
    """Stop one replica with its grace period, remove it if asked, and report its exit."""
    executor().stop(decode(StopReplica, message))


@shared_task(name=WatchReplica.TASK, ignore_result=True)
def watch_replica(**message: Any) -> None:
    """Watch a running replica again (after an agent or console restart), resuming its output."""
    executor().watch(decode(WatchReplica, message))


# Retries of an inventory question the runtime could not answer: about 4.5 minutes in all, inside the
# controller's wait for the answer (jobs.services.reconcile.INVENTORY_ANSWER_WAIT_SECONDS).
LIST_RETRIES = 30
LIST_RETRY_MAX_DELAY_SECONDS = 10


@shared_task(name=ListReplicas.TASK, bind=True, ignore_result=True, max_retries=LIST_RETRIES)
def list_replicas(
    self: Task,
    node: str,
    runtime: str,
    confirmed: list[str] | None = None,
    launched: list[str] | None = None,
    installation: str = "",
) -> None:
    """Report this node's own view of its replicas for reconcile (`Executor.inventory_report`), after putting
    back the egress rules of workload bridges if anything changed them (`inventory.agent.egress`)."""
    asked = decode(
        ListReplicas,
        {"node": node, "runtime": runtime, "confirmed": confirmed, "launched": launched, "installation": installation},
    )
    keep_egress(active_config())
    agent = executor()
    try:
        view = agent.inventory_report(
            node=asked.node,
            runtime=asked.runtime,
            confirmed=asked.confirmed or [],
            launched=asked.launched,
            installation=asked.installation,
        )
    except TransientDriverError as error:
        # The controller asks a node one question at a time and waits minutes for its answer: an engine
        # restarting now must delay the answer, not drop it, or nothing is reconciled until that wait ends.
        delay = min(2**self.request.retries, LIST_RETRY_MAX_DELAY_SECONDS)
        raise self.retry(exc=error, countdown=delay) from error
    agent.report(NodeReplicas.from_wire(view))
