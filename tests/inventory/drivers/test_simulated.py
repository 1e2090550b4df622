"""Simulated runtime and GPUs: deterministic, cheap, and able to show faults."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest

from inventory.drivers import run_health_check, simulated
from inventory.drivers.base import (
    DriverTimeout,
    GpuProbe,
    PermanentDriverError,
    Runtime,
    TransientDriverError,
    WorkloadSpec,
    endpoint_of,
)
from inventory.drivers.policy import SpecRefused
from inventory.drivers.simulated import SimulatedProbe, SimulatedRuntime, simulated_uuid
from inventory.drivers.simulated import _workloads as simulated_workloads
from tests.inventory.drivers.conftest import new_spec

UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node() -> str:
    return f"sim-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def runtime(node: str, clock: Clock) -> SimulatedRuntime:
    return SimulatedRuntime(node, clock=clock)


def sim_spec(duration: float = 10, exit_code: int = 0, **extra: Any) -> WorkloadSpec:
    labels = {simulated.DURATION_LABEL: str(duration), simulated.EXIT_CODE_LABEL: str(exit_code)}
    labels |= extra.pop("labels", {})
    return new_spec(["train"], tenant="acme", labels=labels, **extra)


def test_they_satisfy_the_driver_protocols(runtime: SimulatedRuntime, node: str) -> None:
    assert isinstance(runtime, Runtime)
    assert isinstance(SimulatedProbe(node), GpuProbe)
    assert runtime.info().simulated is True
    assert SimulatedProbe(node).inventory().simulated is True


def test_a_workload_runs_for_its_duration_then_exits_with_its_code(runtime: SimulatedRuntime, clock: Clock) -> None:
    handle = runtime.start(sim_spec(duration=10, exit_code=3))
    assert runtime.poll(handle).state == "running"
    clock.now += 9.9
    assert runtime.poll(handle).state == "running"
    clock.now += 0.2
    status = runtime.poll(handle)
    assert (status.state, status.exit_code) == ("exited", 3)
    assert status.finished_at and status.started_at and status.finished_at > status.started_at


def test_state_follows_from_the_handle_alone(runtime: SimulatedRuntime, clock: Clock, node: str) -> None:
    handle = runtime.start(sim_spec(duration=5))
    simulated_workloads.registry.pop(node)  # as in another process
    assert runtime.poll(handle).state == "running"
    clock.now += 6
    assert runtime.poll(handle).exit_code == 0


def test_stop_ends_it_with_143_and_is_idempotent(runtime: SimulatedRuntime, clock: Clock) -> None:
    handle = runtime.start(sim_spec(duration=100))
    clock.now += 1
    stopped = runtime.stop(handle, grace_seconds=5)
    assert (stopped.state, stopped.exit_code) == ("exited", 143)
    clock.now += 1000
    assert runtime.stop(handle) == stopped == runtime.poll(handle)
    runtime.remove(handle)
    assert runtime.poll(handle).state == "missing"
    assert runtime.list_managed() == []


def test_start_adopts_by_name_and_refuses_another_workloads_name(runtime: SimulatedRuntime, clock: Clock) -> None:
    spec = sim_spec()
    first = runtime.start(spec)
    clock.now += 1
    assert runtime.start(spec) == first
    with pytest.raises(PermanentDriverError) as conflict:
        runtime.start(WorkloadSpec(**{**spec.__dict__, "workload_id": "other"}))
    assert conflict.value.code == "name_conflict"
    [listed] = runtime.list_managed()
    assert (listed.name, listed.state, listed.handle) == (spec.name, "running", first)


def test_bad_labels_and_environments_are_refused(runtime: SimulatedRuntime) -> None:
    with pytest.raises(PermanentDriverError):
        runtime.start(sim_spec(labels={simulated.DURATION_LABEL: "soon"}))
    with pytest.raises(SpecRefused):
        runtime.start(sim_spec(env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    with pytest.raises(SpecRefused) as port:
        runtime.start(sim_spec(service_port=0))
    assert port.value.field == "service_port"


def test_a_service_port_gets_no_endpoint_since_nothing_runs(runtime: SimulatedRuntime) -> None:
    handle = runtime.start(sim_spec(service_port=8888, service_port_env="JUPYTER_PORT"))
    assert endpoint_of(handle) is None and runtime.poll(handle).state == "running"


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("image_not_found", PermanentDriverError),
        ("engine_unreachable", TransientDriverError),
        ("timeout", DriverTimeout),
    ],
)
def test_start_failures_can_be_injected(runtime: SimulatedRuntime, code: str, error: type[Exception]) -> None:
    with pytest.raises(error) as failed:
        runtime.start(sim_spec(labels={simulated.START_ERROR_LABEL: code}))
    assert getattr(failed.value, "code", None) == code
    assert runtime.list_managed() == []


def test_logs_are_deterministic_and_resume_by_cursor(runtime: SimulatedRuntime, clock: Clock) -> None:
    handle = runtime.start(sim_spec(duration=30, exit_code=1))
    clock.now += 12.5
    so_far = list(runtime.logs(handle))
    assert [line.cursor for line in so_far] == [str(i) for i in range(13)]
    assert so_far[9].stream == "stderr" and so_far[0].stream == "stdout"
    assert list(runtime.logs(handle)) == so_far
    clock.now += 100
    rest = list(runtime.logs(handle, since=so_far[-1].cursor))
    assert rest[0].cursor == "13" and rest[-1].text == "exited with code 1"
    assert list(runtime.logs(handle, since=rest[-1].cursor)) == []
    assert [line.timestamp for line in so_far + rest] == sorted(line.timestamp for line in so_far + rest)


def test_follow_waits_for_lines_until_the_end(node: str) -> None:
    runtime = SimulatedRuntime(node)
    labels = {simulated.LOG_INTERVAL_LABEL: "0.05"}
    handle = runtime.start(sim_spec(duration=0.2, labels=labels))
    texts = [line.text for line in runtime.logs(handle, follow=True, timeout=5)]
    assert len(texts) == 5 and texts[-1] == "exited with code 0"
    long = runtime.start(sim_spec(duration=60))
    with pytest.raises(DriverTimeout):
        list(runtime.logs(long, follow=True, timeout=0.2))


def test_health_checks_finish_at_once(node: str) -> None:
    status = run_health_check(
        SimulatedRuntime(node), installation="", image="busybox", command=["true"], gpu_uuids=[], timeout=5
    )
    assert (status.state, status.exit_code) == ("exited", 0)


# --- probe ---------------------------------------------------------------------------


def test_gpu_uuids_are_deterministic_per_node_and_well_formed(node: str) -> None:
    first = [gpu.uuid for gpu in SimulatedProbe(node, gpu_count=8).inventory().gpus]
    again = [gpu.uuid for gpu in SimulatedProbe(node, gpu_count=8).inventory().gpus]
    other = [gpu.uuid for gpu in SimulatedProbe(node + "x", gpu_count=8).inventory().gpus]
    assert first == again and len(set(first)) == 8 and not set(first) & set(other)
    assert all(UUID.fullmatch(u) for u in first)
    assert first[3] == simulated_uuid(node, 3)


def test_inventory_describes_the_model_and_a_node_without_gpus_has_none(node: str) -> None:
    inventory = SimulatedProbe(node, gpu_count=2, model="NVIDIA A100-SXM4-40GB", memory_mib=40960).inventory()
    assert inventory.available and inventory.driver_version and inventory.cuda_version
    assert [(g.index, g.model, g.memory_mib) for g in inventory.gpus] == [
        (0, "NVIDIA A100-SXM4-40GB", 40960),
        (1, "NVIDIA A100-SXM4-40GB", 40960),
    ]
    empty = SimulatedProbe(node, gpu_count=0)
    assert empty.inventory().available is False and empty.inventory().reason
    assert empty.sample() == []


def test_idle_gpus_are_cool_and_busy_ones_follow_their_workloads(node: str, clock: Clock) -> None:
    probe = SimulatedProbe(node, gpu_count=2, clock=clock)
    gpus = [gpu.uuid for gpu in probe.inventory().gpus]
    idle = probe.sample()
    assert [s.utilization_gpu for s in idle] == [0.0, 0.0]
    runtime = SimulatedRuntime(node, clock=clock)
    labels = {simulated.UTILIZATION_LABEL: "80"}
    handle = runtime.start(sim_spec(duration=10, gpu_uuids=[gpus[1]], labels=labels))
    busy = probe.sample()
    assert busy[0].utilization_gpu == 0.0
    assert 75 <= (busy[1].utilization_gpu or 0) <= 85
    assert (busy[1].temperature_c or 0) > (busy[0].temperature_c or 0)
    assert (busy[1].power_w or 0) > (busy[0].power_w or 0) + 300
    assert (busy[1].memory_used_mib or 0) > (busy[0].memory_used_mib or 0)
    assert len(busy[1].processes) == 1
    runtime.stop(handle)
    assert probe.sample()[1].utilization_gpu == 0.0


def test_utilization_can_be_set_by_hand(node: str) -> None:
    probe = SimulatedProbe(node, gpu_count=1, seed=7)
    gpu = probe.inventory().gpus[0].uuid
    probe.set_utilization(gpu, 50)
    assert 47 <= (probe.sample()[0].utilization_gpu or 0) <= 53
    probe.set_utilization(gpu, None)
    assert probe.sample()[0].utilization_gpu == 0.0


def test_samples_are_reproducible_with_a_seed(node: str, clock: Clock) -> None:
    def readings() -> list[Any]:
        probe = SimulatedProbe(node, gpu_count=4, seed=42, clock=clock)
        for gpu in probe.inventory().gpus:
            probe.set_utilization(gpu.uuid, 60)
        return probe.sample()

    assert readings() == readings()


def test_injected_faults_show_in_samples(node: str) -> None:
    probe = SimulatedProbe(node, gpu_count=3)
    a, b, c = (gpu.uuid for gpu in probe.inventory().gpus)
    probe.inject(a, xid=79)
    probe.inject(b, ecc_uncorrected=1)
    probe.inject(c, lost=True)
    first = probe.sample()
    assert first[0].xid_events == [79]
    assert first[1].ecc_uncorrected == 1 and first[1].xid_events == []
    assert first[2].lost is True and first[2].utilization_gpu is None and first[2].temperature_c is None
    second = probe.sample()
    assert second[0].xid_events == [], "an XID is an event, seen once"
    assert second[1].ecc_uncorrected == 1, "ECC counts are volatile totals"
    assert second[2].lost is True
    probe.heal(c)
    assert probe.sample()[2].lost is False
    with pytest.raises(PermanentDriverError):
        probe.inject("GPU-unknown", xid=13)


def test_sampling_eight_gpus_is_cheap(node: str) -> None:
    probe = SimulatedProbe(node, gpu_count=8)
    runtime = SimulatedRuntime(node)
    runtime.start(sim_spec(duration=60, gpu_uuids=[gpu.uuid for gpu in probe.inventory().gpus[:4]]))
    began = time.process_time()
    for _ in range(1000):
        probe.sample()
    per_sample = (time.process_time() - began) / 1000
    # 2% of a core at 1 Hz is 20 ms per second; the probe must use a small part of it.
    assert per_sample < 0.002, f"{per_sample * 1e6:.0f} µs per sample"
