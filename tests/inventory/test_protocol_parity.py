"""The protocol's messages and the driver's dataclasses name the same things the same way.

A start's spec crosses with the driver's `WorkloadSpec` field names and the
workload's units (`cpu_milli`, `memory_mib`, `shm_mib`: `RESOURCE_FIELDS`); a GPU reading with the
driver's `GpuSample` names; what the agent really sends decodes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from common.protocol.messages import RESOURCE_FIELDS, GpuProcessReading, GpuReading, Heartbeat, LiveSamples, ReplicaSpec
from inventory.agent.replicas import driver_spec
from inventory.agent.reporter import Reporter
from inventory.drivers.base import GpuProcess, GpuSample, Resources, WorkloadSpec
from inventory.drivers.simulated import SimulatedProbe


def _names(cls: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_a_start_spec_carries_the_drivers_names_and_the_workloads_units() -> None:
    assert _names(WorkloadSpec) - {"resources", "labels"} <= _names(ReplicaSpec)
    assert _names(Resources) - {"pids"} == {"cpu_milli", "memory_mib", "shm_mib"} == set(RESOURCE_FIELDS)
    assert set(RESOURCE_FIELDS) <= _names(ReplicaSpec)
    spec = ReplicaSpec(
        node="n1", runtime="docker", name="r", workload_id=7, tenant="t", attempt=1, replica=0, image="i",
        cpu_milli=1500, memory_mib=96, shm_mib=48,
    )  # fmt: skip
    assert driver_spec(spec).resources == Resources(cpu_milli=1500, memory_mib=96, shm_mib=48)
    unset = driver_spec(dataclasses.replace(spec, shm_mib=None)).resources
    assert unset.shm_mib is None  # the runtime's default


def test_a_gpu_reading_carries_the_drivers_names() -> None:
    assert _names(GpuReading) == _names(GpuSample)
    assert _names(GpuProcessReading) == _names(GpuProcess)


def test_what_the_agents_reporter_sends_decodes() -> None:
    reports: list[dict[str, Any]] = []
    probe = SimulatedProbe("parity", gpu_count=2)
    reporter = Reporter(node="parity", probe=probe, send_report=reports.append)
    reporter.tick()
    heartbeat = Heartbeat.from_wire(reports[0])
    assert [reading.uuid for reading in heartbeat.samples] == [gpu.uuid for gpu in probe.inventory().gpus]
    assert set(heartbeat.history) == {gpu.uuid for gpu in probe.inventory().gpus}
    assert LiveSamples.from_wire({"samples": reporter.latest}).samples == heartbeat.samples
