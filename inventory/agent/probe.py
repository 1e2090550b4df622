"""The agent's side of provisioning: probe the runtime, inventory the GPUs, run the health check."""

from __future__ import annotations

import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from inventory.agent import AGENT_VERSION
from inventory.agent.config import AgentConfig
from inventory.drivers import make_probe, make_runtime, run_health_check
from inventory.drivers.base import DriverError, GpuProbe, Runtime

HEALTH_CHECK_TIMEOUT = 120.0
_simulated_probes: dict[str, GpuProbe] = {}


def simulated_probe(node: str, *, gpu_count: int, model: str) -> GpuProbe:
    """Return this process's simulated probe of `node`, so injected faults persist between calls."""
    probe = _simulated_probes.get(node)
    if probe is None:
        probe = make_probe("simulated", node_name=node, gpu_count=gpu_count, model=model)
        _simulated_probes[node] = probe
    return probe


def _error(report: dict[str, Any], step: str, error: DriverError) -> dict[str, Any]:
    report["error"] = {"step": step, "code": error.code, "message": str(error)}
    return report


def _drivers(request: dict[str, Any], config: AgentConfig | None) -> tuple[Runtime, GpuProbe]:
    """Build the runtime and probe a request asks for; raises DriverError when this agent cannot serve it."""
    node = str(request["node"])
    if request["runtime"] == "simulated":
        count, model = int(request.get("simulated_gpu_count") or 0), str(request.get("simulated_gpu_model") or "")
        runtime = make_runtime("simulated", node_name=node, work_dir=_work_dir(config, node), process_enabled=False)
        return runtime, simulated_probe(node, gpu_count=count, model=model or "NVIDIA H100 80GB HBM3")
    if config is None or config.node != node:
        serving = config.node if config else "no node"
        raise DriverError(f"this agent serves {serving}, not node {node}", code="wrong_agent")
    runtime = make_runtime(
        str(request["runtime"]),
        node_name=node,
        work_dir=config.work_dir,
        process_enabled=config.process_enabled,
        docker_url=config.docker_url,
    )
    if config.probe == "simulated":
        probe = simulated_probe(node, gpu_count=config.simulated_gpu_count, model=config.simulated_gpu_model)
    else:
        probe = make_probe(config.probe, node_name=node)
    return runtime, probe


def _work_dir(config: AgentConfig | None, node: str) -> Path:
    # Simulated runtimes keep nothing on disk; the path only satisfies the registry's signature.
    return config.work_dir if config is not None else Path(tempfile.gettempdir()) / "gpucloud-simulated" / node


def probe_node(request: dict[str, Any], config: AgentConfig | None) -> dict[str, Any]:
    """Run the provisioning probe `request` describes and return the report; never raises.

    The report holds `runtime` (RuntimeInfo), `gpus` (GpuInventory) and
    `health_check` (exit code, state, message), or `error` with the step that
    failed. The controller decides from it whether the node may serve.
    """
    report: dict[str, Any] = {
        "node": request.get("node"),
        "attempt": request.get("attempt"),
        "agent_version": AGENT_VERSION,
    }
    try:
        runtime, probe = _drivers(request, config)
        report["runtime"] = asdict(runtime.info())
    except DriverError as error:
        return _error(report, "runtime", error)
    inventory = probe.inventory()
    report["gpus"] = asdict(inventory)
    check = request.get("health_check") or {}
    try:
        status = run_health_check(
            runtime,
            installation=str(request.get("installation") or ""),
            image=str(check.get("image", "")),
            command=[str(part) for part in check.get("command") or ["true"]],
            gpu_uuids=[gpu.uuid for gpu in inventory.gpus],
            timeout=HEALTH_CHECK_TIMEOUT,
        )
    except DriverError as error:
        return _error(report, "health_check", error)
    report["health_check"] = {"exit_code": status.exit_code, "state": status.state, "message": status.message}
    return report
