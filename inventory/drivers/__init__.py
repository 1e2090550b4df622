"""Drivers: the only code that talks to Docker, local processes and NVML (contract in `base`).

A small registry picks an implementation by the kind stored on a node:

- runtimes: `docker` (production), `process` (single-host development,
  refused unless enabled), `simulated` (demos, scale tests);
- GPU probes: `nvml` (real hosts; reports no GPUs where NVML is absent)
  and `simulated`.

Each technology is a package (`docker`, `process`, `simulated`,
`storage`, `nvml`) whose `__init__` is its public surface; its
`_`-modules are its own (import-linter contracts in pyproject.toml).
Implementations are imported when first asked for, so importing this
package stays cheap (the process supervisor imports it on every start).
"""

from __future__ import annotations

from pathlib import Path

from inventory.drivers.base import GpuProbe, PermanentDriverError, Runtime
from inventory.drivers.health import run_health_check

RUNTIME_KINDS = ("docker", "process", "simulated")
PROBE_KINDS = ("nvml", "simulated")
DEFAULT_SIMULATED_MODEL = "NVIDIA H100 80GB HBM3"

__all__ = ["PROBE_KINDS", "RUNTIME_KINDS", "make_probe", "make_runtime", "run_health_check"]


def make_runtime(
    kind: str,
    *,
    node_name: str,
    work_dir: Path,
    process_enabled: bool,
    docker_url: str | None = None,
    pull_images: bool = False,
    publish_address: str = "127.0.0.1",
) -> Runtime:
    """Return the runtime of `kind` for node `node_name`; raises PermanentDriverError for an unknown kind.

    `work_dir` holds the process runtime's workloads; `process_enabled`
    must be True for it to run anything. `docker_url` is the engine's
    address (default: the local socket); `pull_images` lets the Docker
    runtime pull a missing image instead of refusing it; `publish_address`
    is the IP address the Docker runtime publishes service ports on (one the
    console reaches; PermanentDriverError `invalid_publish_address` for a
    wildcard or a name).
    """
    if kind == "docker":
        from inventory.drivers.docker import DockerRuntime

        return DockerRuntime(docker_url, pull_images=pull_images, publish_address=publish_address)
    if kind == "process":
        from inventory.drivers.process import ProcessRuntime

        return ProcessRuntime(work_dir, process_enabled)
    if kind == "simulated":
        from inventory.drivers.simulated import SimulatedRuntime

        return SimulatedRuntime(node_name)
    raise PermanentDriverError(f"unknown runtime {kind!r}; known: {', '.join(RUNTIME_KINDS)}", code="unknown_runtime")


def make_probe(kind: str, *, node_name: str, gpu_count: int = 8, model: str = DEFAULT_SIMULATED_MODEL) -> GpuProbe:
    """Return the GPU probe of `kind`; `gpu_count` and `model` shape a simulated node only.

    Raises PermanentDriverError for an unknown kind. Each call makes a new
    probe: keep one per node to keep a simulated probe's injected faults.
    """
    if kind == "nvml":
        from inventory.drivers.nvml import NvmlProbe

        return NvmlProbe()
    if kind == "simulated":
        from inventory.drivers.simulated import SimulatedProbe

        return SimulatedProbe(node_name, gpu_count=gpu_count, model=model)
    raise PermanentDriverError(f"unknown GPU probe {kind!r}; known: {', '.join(PROBE_KINDS)}", code="unknown_probe")
