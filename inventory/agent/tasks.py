"""Tasks the agent runs on its node's queue (`node.<name>`); simulated nodes' run on `control`."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from inventory.agent.config import active_config
from inventory.agent.probe import probe_node as run_probe


@shared_task(name="agent.probe_node")
def probe_node(request: dict[str, Any]) -> dict[str, Any]:
    """Probe this node for provisioning; return the report (never raises, errors are in the report)."""
    return run_probe(request, active_config())
