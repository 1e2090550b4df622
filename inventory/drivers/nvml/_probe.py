"""GPU probe for real hosts through NVML (nvidia-ml-py, imported as `pynvml`).

`pynvml` is imported on first use, never at import time, and every NVML
failure stays inside: a host without the library or the driver reports
`available=False` with the reason, and `sample()` returns []. Initialising
is retried every `retry_seconds`, so a driver loaded later is picked up.
Per device, a reading the GPU does not support is None, not an error; a
GPU that answers NVML_ERROR_GPU_IS_LOST is sampled as `lost=True`. XID
errors come from an NVML event set drained without waiting at each sample.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from inventory.drivers.base import GpuInfo, GpuInventory, GpuProcess, GpuSample

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
_MAX_EVENTS_PER_SAMPLE = 1000


class _GpuLost(Exception):
    """A device answered NVML_ERROR_GPU_IS_LOST."""


@dataclass(frozen=True)
class _Device:
    index: int
    handle: Any
    uuid: str


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlProbe:
    """Reads this host's NVIDIA GPUs; `library` replaces the `pynvml` module (tests pass a fake one)."""

    def __init__(self, library: Any | None = None, *, retry_seconds: float = 60.0) -> None:
        self._library = library
        self._retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self._ready = False
        self._reason = ""
        self._next_try = 0.0
        self._devices: list[_Device] = []
        self._events: Any = None

    # --- setup -----------------------------------------------------------------

    @property
    def _nvml(self) -> Any:
        if self._library is None:
            import pynvml  # here, not at the top: hosts without a GPU import this module too

            self._library = pynvml
        return self._library

    def _start(self) -> bool:
        """Initialise NVML and find the devices once; on failure remember why and retry later."""
        with self._lock:
            if self._ready:
                return True
            if time.monotonic() < self._next_try:
                return False
            try:
                nvml = self._nvml
                nvml.nvmlInit()
                self._devices = self._discover()
            except ImportError as error:
                self._fail(f"NVML not available: {error}")
                return False
            except Exception as error:
                if not self._is_nvml_error(error):
                    raise
                self._fail(f"NVML not available: {error}")
                return False
            self._events = self._watch_xids()
            self._ready = True
            return True

    def _fail(self, reason: str) -> None:
        self._reason = reason
        self._next_try = time.monotonic() + self._retry_seconds

    def _is_nvml_error(self, error: BaseException) -> bool:
        library = self._library
        return library is not None and isinstance(error, library.NVMLError)

    def _code(self, error: BaseException) -> int | None:
        return getattr(error, "value", None) if self._is_nvml_error(error) else None

    def _discover(self) -> list[_Device]:
        nvml = self._nvml
        devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                devices.append(_Device(index, handle, _text(nvml.nvmlDeviceGetUUID(handle))))
            except nvml.NVMLError as error:
                # A GPU lost before it could be named cannot be sampled; the inventory says it is missing.
                log.warning("NVML cannot open GPU %d: %s", index, error)
        return devices

    def _watch_xids(self) -> Any:
        """Return an event set registered for critical XID errors on every device that supports it."""
        nvml = self._nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as error:
            log.info("NVML events unavailable, no XID reporting: %s", error)
            return None
        for device in self._devices:
            try:
                nvml.nvmlDeviceRegisterEvents(device.handle, nvml.nvmlEventTypeXidCriticalError, events)
            except nvml.NVMLError as error:
                log.info("no XID events from GPU %d: %s", device.index, error)
        return events

    def close(self) -> None:
        """Release NVML; a later call initialises it again."""
        with self._lock:
            if self._ready:
                nvml = self._nvml
                try:
                    if self._events is not None:
                        nvml.nvmlEventSetFree(self._events)
                    nvml.nvmlShutdown()
                except nvml.NVMLError:
                    log.info("NVML shutdown failed", exc_info=True)
            self._ready, self._events, self._devices, self._next_try = False, None, [], 0.0

    # --- readings ------------------------------------------------------------------

    def _read(self, call: Callable[..., Any], *args: Any) -> Any:
        """Return call(*args), or None when the device does not support it; raises _GpuLost for a lost GPU."""
        try:
            return call(*args)
        except Exception as error:
            code = self._code(error)
            if code is None:
                raise
            if code == self._nvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost from error
            return None

    def inventory(self) -> GpuInventory:
        """Return the GPUs with model, memory and MIG mode, and the driver and CUDA versions; never raises."""
        if not self._start():
            return GpuInventory(available=False, reason=self._reason)
        nvml = self._nvml
        driver = self._read(nvml.nvmlSystemGetDriverVersion)
        cuda = self._read(nvml.nvmlSystemGetCudaDriverVersion)
        gpus, lost = [], []
        for device in self._devices:
            try:
                gpus.append(self._info(device))
            except _GpuLost:
                lost.append(str(device.index))
        reason = f"GPU {', '.join(lost)} lost" if lost else ""
        if not gpus:
            reason = reason or "no NVIDIA GPU found"
        return GpuInventory(
            available=bool(gpus),
            gpus=gpus,
            driver_version=_text(driver) if driver is not None else None,
            cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
            reason=reason,
        )

    def _info(self, device: _Device) -> GpuInfo:
        nvml = self._nvml
        memory = self._read(nvml.nvmlDeviceGetMemoryInfo, device.handle)
        name = self._read(nvml.nvmlDeviceGetName, device.handle)
        return GpuInfo(
            index=device.index,
            uuid=device.uuid,
            model=_text(name) if name is not None else "unknown",
            memory_mib=int(memory.total) // _MIB if memory is not None else 0,
            mig_mode=self._mig_mode(device),
        )

    def _mig_mode(self, device: _Device) -> Literal["disabled", "enabled", "unsupported"]:
        nvml = self._nvml
        modes = self._read(nvml.nvmlDeviceGetMigMode, device.handle)
        if modes is None:
            return "unsupported"
        return "enabled" if modes[0] == nvml.NVML_DEVICE_MIG_ENABLE else "disabled"

    def sample(self) -> list[GpuSample]:
        """Return one sample per GPU (empty without NVML); unsupported readings are None, lost GPUs `lost=True`."""
        if not self._start():
            return []
        xids = self._drain_xids()
        now = time.time()
        samples = []
        for device in self._devices:
            events = xids.get(device.uuid, [])
            try:
                samples.append(self._sample(device, now, events))
            except _GpuLost:
                samples.append(
                    GpuSample(uuid=device.uuid, index=device.index, timestamp=now, xid_events=events, lost=True)
                )
        return samples

    def _sample(self, device: _Device, now: float, xids: list[int]) -> GpuSample:
        nvml, handle = self._nvml, device.handle
        rates = self._read(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._read(nvml.nvmlDeviceGetMemoryInfo, handle)
        power = self._read(nvml.nvmlDeviceGetPowerUsage, handle)
        ecc = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        processes = self._read(nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        return GpuSample(
            uuid=device.uuid,
            index=device.index,
            timestamp=now,
            utilization_gpu=float(rates.gpu) if rates is not None else None,
            utilization_memory=float(rates.memory) if rates is not None else None,
            memory_used_mib=int(memory.used) // _MIB if memory is not None else None,
            memory_total_mib=int(memory.total) // _MIB if memory is not None else None,
            temperature_c=self._float(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
            power_w=power / 1000 if power is not None else None,
            sm_clock_mhz=self._read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
            ecc_corrected=self._read(nvml.nvmlDeviceGetTotalEccErrors, handle, ecc[0], nvml.NVML_VOLATILE_ECC),
            ecc_uncorrected=self._read(nvml.nvmlDeviceGetTotalEccErrors, handle, ecc[1], nvml.NVML_VOLATILE_ECC),
            xid_events=xids,
            processes=[
                GpuProcess(pid=int(p.pid), used_memory_mib=int(p.usedGpuMemory) // _MIB if p.usedGpuMemory else None)
                for p in processes or []
            ],
        )

    def _float(self, call: Callable[..., Any], *args: Any) -> float | None:
        value = self._read(call, *args)
        return float(value) if value is not None else None

    def _drain_xids(self) -> dict[str, list[int]]:
        """Return the XID codes of the critical-error events that arrived since the last call, by GPU UUID."""
        if self._events is None:
            return {}
        nvml = self._nvml
        found: dict[str, list[int]] = {}
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                event = nvml.nvmlEventSetWait(self._events, 0)
                gpu = _text(nvml.nvmlDeviceGetUUID(event.device))
            except nvml.NVMLError as error:
                if error.value != nvml.NVML_ERROR_TIMEOUT:
                    log.info("reading NVML events failed: %s", error)
                break
            if event.eventType == nvml.nvmlEventTypeXidCriticalError:
                found.setdefault(gpu, []).append(int(event.eventData))
        return found
