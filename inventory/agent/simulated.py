"""Heartbeats of simulated nodes: they have no agent process, so the controller reports for them."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from inventory.agent import AGENT_VERSION
from inventory.agent.probe import simulated_probe


def simulated_reports(nodes: list[tuple[str, int, str]]) -> list[dict[str, Any]]:
    """Return one heartbeat report per (name, GPU count, model), with samples from each node's simulated probe."""
    reports = []
    for name, count, model in nodes:
        probe = simulated_probe(name, gpu_count=count, model=model or "NVIDIA H100 80GB HBM3")
        samples = [asdict(sample) for sample in probe.sample()]
        reports.append(
            {"node": name, "agent_version": f"{AGENT_VERSION}-simulated", "sent_at": time.time(), "samples": samples}
        )
    return reports
