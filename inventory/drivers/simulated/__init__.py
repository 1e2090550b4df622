"""Simulated nodes: `SimulatedRuntime` and `SimulatedProbe` (see `_runtime` for the contract).

Public: the runtime and the probe; `simulated_uuid`, the GPU UUIDs a
simulated node reports; `SimulatedWorkload`, what a simulated handle
decodes to; the labels that shape a simulated workload. The `_`-modules
are this package's own: an import-linter contract (pyproject.toml) keeps
every other module out of them.
"""

from __future__ import annotations

from inventory.drivers.simulated._runtime import (
    DURATION_LABEL,
    EXIT_CODE_LABEL,
    LOG_INTERVAL_LABEL,
    START_ERROR_LABEL,
    UTILIZATION_LABEL,
    SimulatedProbe,
    SimulatedRuntime,
    simulated_uuid,
)
from inventory.drivers.simulated._workloads import SimulatedWorkload

__all__ = [
    "DURATION_LABEL",
    "EXIT_CODE_LABEL",
    "LOG_INTERVAL_LABEL",
    "START_ERROR_LABEL",
    "UTILIZATION_LABEL",
    "SimulatedProbe",
    "SimulatedRuntime",
    "SimulatedWorkload",
    "simulated_uuid",
]
