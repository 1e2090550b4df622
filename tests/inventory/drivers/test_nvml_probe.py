"""The NVML probe through a fake `pynvml` that raises the real NVMLError classes, and the real one here."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from inventory.drivers import make_probe
from inventory.drivers.base import GpuProbe
from inventory.drivers.nvml import NvmlProbe

MIB = 1024 * 1024


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 81559 * MIB
    used: int = 1024 * MIB
    mig: int | None = pynvml.NVML_DEVICE_MIG_DISABLE  # None: not supported
    unsupported: set[str] = field(default_factory=set)  # names of calls that answer NOT_SUPPORTED
    lost: bool = False
    ecc: tuple[int, int] = (0, 0)
    processes: list[Any] = field(default_factory=list)


class FakeNvml:
    """Just enough of the pynvml module, with its constants and real error classes."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None, events: bool = True) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.init_error = init_error
        self.events_supported = events
        self.pending: deque[Any] = deque()
        self.registered: list[str] = []
        self.init_calls = 0

    def _gpu(self, handle: FakeGpu, call: str) -> FakeGpu:
        if handle.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if call in handle.unsupported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise nvml_error(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid  # NVML answers this one even for a lost GPU

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return self._gpu(handle, "name").name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> Any:
        gpu = self._gpu(handle, "memory")
        return SimpleNamespace(total=gpu.total, used=gpu.used, free=gpu.total - gpu.used)

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> list[int]:
        gpu = self._gpu(handle, "mig")
        if gpu.mig is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig, gpu.mig]

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> Any:
        self._gpu(handle, "utilization")
        return SimpleNamespace(gpu=87, memory=41)

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        self._gpu(handle, "temperature")
        return 64

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._gpu(handle, "power")
        return 612_345

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        self._gpu(handle, "clock")
        return 1980

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, kind: int, counter: int) -> int:
        assert counter == pynvml.NVML_VOLATILE_ECC
        return self._gpu(handle, "ecc").ecc[kind]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[Any]:
        return self._gpu(handle, "processes").processes

    def nvmlEventSetCreate(self) -> str:
        if not self.events_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return "event-set"

    def nvmlEventSetFree(self, events: str) -> None:
        pass

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, types: int, events: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError and events == "event-set"
        self._gpu(handle, "events")
        self.registered.append(handle.uuid)

    def nvmlEventSetWait(self, events: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0, "sampling must never wait for events"
        if not self.pending:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        return self.pending.popleft()

    def xid(self, gpu: FakeGpu, code: int) -> None:
        self.pending.append(SimpleNamespace(device=gpu, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=code))


def two_gpus() -> list[FakeGpu]:
    return [
        FakeGpu("GPU-aaaaaaaa-0000-0000-0000-000000000000", mig=pynvml.NVML_DEVICE_MIG_ENABLE),
        FakeGpu(
            "GPU-bbbbbbbb-0000-0000-0000-000000000000",
            name="NVIDIA GeForce RTX 4090",
            total=24564 * MIB,
            mig=None,
            unsupported={"ecc", "power"},
            processes=[SimpleNamespace(pid=4242, usedGpuMemory=2048 * MIB), SimpleNamespace(pid=7, usedGpuMemory=None)],
        ),
    ]


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML not available: NVML Shared Library Not Found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVML not available: Driver Not Loaded"),
    ],
)
def test_a_host_without_nvml_reports_unavailable_and_samples_nothing(code: int, reason: str) -> None:
    probe = NvmlProbe(FakeNvml([], init_error=code))
    inventory = probe.inventory()
    assert (inventory.available, inventory.reason, inventory.gpus) == (False, reason, [])
    assert probe.sample() == []


def test_initialisation_is_retried_later_not_on_every_call() -> None:
    library = FakeNvml(two_gpus(), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    waiting = NvmlProbe(library, retry_seconds=3600)
    waiting.inventory()
    waiting.sample()
    library.init_error = None
    assert waiting.inventory().available is False, "not retried within retry_seconds"
    assert library.init_calls == 1
    library = FakeNvml(two_gpus(), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    eager = NvmlProbe(library, retry_seconds=0)
    assert eager.inventory().available is False
    library.init_error = None
    assert eager.inventory().available is True, "the driver came back"


def test_nvml_without_gpus_reports_none_found() -> None:
    inventory = NvmlProbe(FakeNvml([])).inventory()
    assert (inventory.available, inventory.reason) == (False, "no NVIDIA GPU found")
    assert inventory.driver_version == "550.54.15"


def test_inventory_lists_gpus_with_memory_mig_mode_and_versions() -> None:
    inventory = NvmlProbe(FakeNvml(two_gpus())).inventory()
    assert inventory.available and not inventory.simulated
    assert (inventory.driver_version, inventory.cuda_version) == ("550.54.15", "12.4")
    assert [(g.index, g.uuid[:12], g.model, g.memory_mib, g.mig_mode) for g in inventory.gpus] == [
        (0, "GPU-aaaaaaaa", "NVIDIA H100 80GB HBM3", 81559, "enabled"),
        (1, "GPU-bbbbbbbb", "NVIDIA GeForce RTX 4090", 24564, "unsupported"),
    ]


def test_samples_convert_units_and_leave_unsupported_readings_empty() -> None:
    first, second = NvmlProbe(FakeNvml(two_gpus())).sample()
    assert (first.utilization_gpu, first.utilization_memory, first.temperature_c) == (87.0, 41.0, 64.0)
    assert (first.memory_used_mib, first.memory_total_mib, first.sm_clock_mhz) == (1024, 81559, 1980)
    assert first.power_w == pytest.approx(612.345)
    assert (first.ecc_corrected, first.ecc_uncorrected, first.lost) == (0, 0, False)
    assert (second.power_w, second.ecc_corrected, second.ecc_uncorrected) == (None, None, None)
    assert second.utilization_gpu == 87.0, "one unsupported reading does not hide the others"
    assert [(p.pid, p.used_memory_mib) for p in second.processes] == [(4242, 2048), (7, None)]


def test_a_lost_gpu_is_sampled_as_lost_while_the_others_still_report() -> None:
    gpus = two_gpus()
    library = FakeNvml(gpus)
    probe = NvmlProbe(library)
    probe.inventory()
    gpus[0].lost = True
    lost, fine = probe.sample()
    assert (lost.uuid, lost.lost, lost.utilization_gpu, lost.temperature_c) == (gpus[0].uuid, True, None, None)
    assert (fine.lost, fine.utilization_gpu) == (False, 87.0)
    inventory = probe.inventory()
    assert [g.uuid for g in inventory.gpus] == [gpus[1].uuid] and "lost" in inventory.reason


def test_xid_events_are_drained_without_waiting_and_reported_once() -> None:
    gpus = two_gpus()
    gpus[1].unsupported.add("events")
    library = FakeNvml(gpus)
    probe = NvmlProbe(library)
    assert probe.sample()[0].xid_events == []
    assert library.registered == [gpus[0].uuid], "a GPU without event support is skipped, not fatal"
    library.xid(gpus[0], 79)
    library.xid(gpus[0], 48)
    library.xid(gpus[1], 13)
    first, second = probe.sample()
    assert (first.xid_events, second.xid_events) == ([79, 48], [13])
    assert [s.xid_events for s in probe.sample()] == [[], []]


def test_a_host_without_event_support_still_samples() -> None:
    assert len(NvmlProbe(FakeNvml(two_gpus(), events=False)).sample()) == 2


def test_the_real_nvml_on_this_gpu_less_host_reports_unavailable() -> None:
    probe = make_probe("nvml", node_name="here")
    assert isinstance(probe, NvmlProbe) and isinstance(probe, GpuProbe)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this host has NVML")
    inventory = probe.inventory()
    assert inventory.available is False
    assert inventory.reason.startswith("NVML not available: ")
    assert probe.sample() == []
