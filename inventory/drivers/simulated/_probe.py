"""The simulated GPU probe: GPUs that exist only as numbers, with faults injected by hand.

Utilization follows the simulated workloads running on each GPU (read from
the registry of `_workloads`), or a utilization set by hand;
injected faults (XID, uncorrected ECC, lost GPU) let GPU health be
exercised without hardware. Everything reports `simulated=True`.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field

from inventory.drivers.base import GpuInfo, GpuInventory, GpuProcess, GpuSample, PermanentDriverError
from inventory.drivers.simulated._workloads import Clock, registry, registry_lock

DRIVER_VERSION = "550.54.15"
CUDA_VERSION = "12.4"
_UUID_NAMESPACE = uuid.UUID("6d1f4a7e-2b0c-4b8e-9a51-3f6c0e2d9b17")


@dataclass
class _GpuState:
    info: GpuInfo
    utilization: float | None = None
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    lost: bool = False
    pending_xids: list[int] = field(default_factory=list)


def simulated_uuid(node_name: str, index: int) -> str:
    """Return the UUID of simulated GPU `index` of `node_name`: the same on every call and every host."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"


def _max_power(model: str) -> float:
    for marker, watts in (("H200", 700.0), ("H100", 700.0), ("A100", 400.0), ("L40", 300.0)):
        if marker in model:
            return watts
    return 350.0


class SimulatedProbe:
    """GPUs of node `node_name` that exist only in memory, with injectable faults.

    Utilization follows the simulated workloads running on each GPU unless
    `set_utilization` fixes it; temperature, power, clocks and memory follow
    utilization, with a little deterministic noise (`seed`, by default
    derived from the node name).
    """

    def __init__(
        self,
        node_name: str,
        gpu_count: int = 8,
        model: str = "NVIDIA H100 80GB HBM3",
        memory_mib: int = 81559,
        seed: int | None = None,
        *,
        clock: Clock = time.time,
    ) -> None:
        self.node = node_name
        self.model = model
        self.memory_mib = memory_mib
        self.clock = clock
        self._random = random.Random(zlib.crc32(node_name.encode()) if seed is None else seed)  # noqa: S311 -- not security
        self._max_power = _max_power(model)
        self._gpus = [
            _GpuState(GpuInfo(index=i, uuid=simulated_uuid(node_name, i), model=model, memory_mib=memory_mib))
            for i in range(gpu_count)
        ]
        self._by_uuid = {gpu.info.uuid: gpu for gpu in self._gpus}
        self._lock = threading.Lock()

    def _gpu(self, gpu_uuid: str) -> _GpuState:
        try:
            return self._by_uuid[gpu_uuid]
        except KeyError:
            raise PermanentDriverError(f"no simulated GPU {gpu_uuid} on {self.node}", code="not_found") from None

    def set_utilization(self, gpu_uuid: str, percent: float | None) -> None:
        """Fix the utilization of one GPU (0-100), or follow its workloads again with None."""
        self._gpu(gpu_uuid).utilization = None if percent is None else max(0.0, min(float(percent), 100.0))

    def inject(
        self,
        gpu_uuid: str,
        *,
        xid: int | None = None,
        ecc_uncorrected: int = 0,
        ecc_corrected: int = 0,
        lost: bool | None = None,
    ) -> None:
        """Inject a fault: an XID (seen once, in the next sample), ECC errors (counted up), or a lost GPU."""
        gpu = self._gpu(gpu_uuid)
        with self._lock:
            if xid is not None:
                gpu.pending_xids.append(int(xid))
            gpu.ecc_uncorrected += ecc_uncorrected
            gpu.ecc_corrected += ecc_corrected
            if lost is not None:
                gpu.lost = lost

    def heal(self, gpu_uuid: str) -> None:
        """Clear every injected fault of one GPU, as after a reset."""
        gpu = self._gpu(gpu_uuid)
        with self._lock:
            gpu.pending_xids.clear()
            gpu.ecc_corrected = gpu.ecc_uncorrected = 0
            gpu.lost = False

    def inventory(self) -> GpuInventory:
        """Return the simulated GPUs; a node simulated with none reports `available=False` like NVML would."""
        if not self._gpus:
            return GpuInventory(
                available=False, reason="no NVIDIA GPU found (simulated node without GPUs)", simulated=True
            )
        return GpuInventory(
            available=True,
            gpus=[gpu.info for gpu in self._gpus],
            driver_version=DRIVER_VERSION,
            cuda_version=CUDA_VERSION,
            simulated=True,
        )

    def sample(self) -> list[GpuSample]:
        """Return one sample per GPU; cheap (no I/O), so it can run every second on thousands of nodes."""
        now = self.clock()
        load = self._workload_load(now)
        with self._lock:
            return [self._sample(gpu, now, load.get(gpu.info.uuid, (0.0, []))) for gpu in self._gpus]

    def _workload_load(self, now: float) -> dict[str, tuple[float, list[GpuProcess]]]:
        with registry_lock:
            running = [w for w in registry.get(self.node, {}).values() if w.gpu_uuids and w.running(now)]
        load: dict[str, tuple[float, list[GpuProcess]]] = {}
        for workload in running:
            pid = 10_000 + zlib.crc32(workload.name.encode()) % 50_000
            for gpu_uuid in workload.gpu_uuids:
                busy, processes = load.get(gpu_uuid, (0.0, []))
                used = int(self.memory_mib * 0.6 * workload.utilization / 100)
                load[gpu_uuid] = (min(busy + workload.utilization, 100.0), [*processes, GpuProcess(pid, used)])
        return load

    def _sample(self, gpu: _GpuState, now: float, load: tuple[float, list[GpuProcess]]) -> GpuSample:
        xids, gpu.pending_xids = gpu.pending_xids, []
        if gpu.lost:
            return GpuSample(uuid=gpu.info.uuid, index=gpu.info.index, timestamp=now, xid_events=xids, lost=True)
        busy, processes = load
        target = gpu.utilization if gpu.utilization is not None else busy
        utilization = max(0.0, min(100.0, target + self._random.uniform(-2, 2))) if target > 0 else 0.0
        share = utilization / 100
        used = (
            sum(p.used_memory_mib or 0 for p in processes)
            if gpu.utilization is None
            else int(0.6 * share * self.memory_mib)
        )
        return GpuSample(
            uuid=gpu.info.uuid,
            index=gpu.info.index,
            timestamp=now,
            utilization_gpu=round(utilization, 1),
            utilization_memory=round(utilization * 0.6, 1),
            memory_used_mib=min(used + 4, self.memory_mib),
            memory_total_mib=self.memory_mib,
            temperature_c=round(31 + 45 * share + self._random.uniform(-0.5, 0.5), 1),
            power_w=round(70 + (self._max_power - 70) * share + self._random.uniform(-3, 3), 1),
            sm_clock_mhz=1980 if share > 0.05 else 345,
            ecc_corrected=gpu.ecc_corrected,
            ecc_uncorrected=gpu.ecc_uncorrected,
            xid_events=xids,
            processes=list(processes),
        )
