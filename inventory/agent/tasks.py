"""Tasks the agent runs on its node's queue (`node.<name>`); simulated nodes' run on `control`."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from inventory.agent.config import active_config
from inventory.agent.executor import executor
from inventory.agent.probe import probe_node as run_probe


@shared_task(name="agent.probe_node")
def probe_node(request: dict[str, Any]) -> dict[str, Any]:
    """Probe this node for provisioning; return the report (never raises, errors are in the report)."""
    return run_probe(request, active_config())


@shared_task(name="agent.start_replica", ignore_result=True)
def start_replica(spec: dict[str, Any]) -> None:
    """Start or adopt one replica and watch it (reports go to the controller)."""
    executor().start(spec)


@shared_task(name="agent.stop_replica", ignore_result=True)
def stop_replica(**message: Any) -> None:
    """Stop one replica with its grace period, remove it if asked, and report its exit."""
    executor().stop(message)


@shared_task(name="agent.watch_replica", ignore_result=True)
def watch_replica(**message: Any) -> None:
    """Watch a running replica again (after an agent or console restart), resuming its output."""
    executor().watch(message)


@shared_task(name="agent.list_replicas", ignore_result=True)
def list_replicas(
    node: str, runtime: str, confirmed: list[str] | None = None, launched: list[str] | None = None
) -> None:
    """Report this node's own view of its replicas for reconcile (`Executor.inventory_report`)."""
    agent = executor()
    view = agent.inventory_report(node=node, runtime=runtime, confirmed=confirmed or [], launched=launched)
    agent.report("jobs.node_replicas", **view)
