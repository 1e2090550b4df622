"""Simulated nodes: a runtime whose workloads only pretend to run, and GPUs that exist only as numbers.

For demos, scale tests and benchmarks; everything reports `simulated=True`.
Cheap by design (thousands of nodes in one process): a workload's state is
computed from its handle and the clock, plus an in-process registry that
remembers stops and removals. Labels shape a workload:

- `simulate.duration_seconds` (default 60; 0.2 for health checks),
- `simulate.exit_code` (default 0) when it ends by itself,
- `simulate.utilization` (percent, default 90) of each GPU it holds,
- `simulate.log_interval_seconds` (default 1) between synthetic lines,
- `simulate.start_error`: start fails with this driver error code
  (`engine_unreachable` is transient, `timeout` a DriverTimeout, any
  other code permanent), for tests and demos of failure handling.

The probe follows the workloads running on its node's GPUs, or a
utilization set by hand, and takes injected faults (XID, uncorrected ECC,
lost GPU) so GPU health can be exercised without hardware.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from inventory.drivers import policy
from inventory.drivers.base import (
    DEFAULT_TIMEOUT,
    DriverTimeout,
    GpuInfo,
    GpuInventory,
    GpuProcess,
    GpuSample,
    Handle,
    LogLine,
    ManagedWorkload,
    PermanentDriverError,
    RuntimeInfo,
    Stream,
    TransientDriverError,
    WorkloadSpec,
    WorkloadStatus,
)
from inventory.drivers.timestamps import format_ns

Clock = Callable[[], float]

DURATION_LABEL = "simulate.duration_seconds"
EXIT_CODE_LABEL = "simulate.exit_code"
UTILIZATION_LABEL = "simulate.utilization"
LOG_INTERVAL_LABEL = "simulate.log_interval_seconds"
START_ERROR_LABEL = "simulate.start_error"
DEFAULT_DURATION = 60.0
HEALTH_CHECK_DURATION = 0.2
SIGTERM_EXIT_CODE = 143
DRIVER_VERSION = "550.54.15"
CUDA_VERSION = "12.4"
_UUID_NAMESPACE = uuid.UUID("6d1f4a7e-2b0c-4b8e-9a51-3f6c0e2d9b17")


@dataclass
class _Workload:
    """One simulated workload; everything but `stopped_at` and `removed` is also in its handle."""

    name: str
    workload_id: str
    tenant: str
    attempt: int
    replica: int
    started_at: float
    duration: float
    exit_code: int
    utilization: float
    log_interval: float
    gpu_uuids: tuple[str, ...] = ()
    stopped_at: float | None = None
    removed: bool = False

    @property
    def ends_at(self) -> float:
        natural = self.started_at + self.duration
        return natural if self.stopped_at is None else min(natural, self.stopped_at)

    @property
    def final_code(self) -> int:
        stopped_early = self.stopped_at is not None and self.stopped_at < self.started_at + self.duration
        return SIGTERM_EXIT_CODE if stopped_early else self.exit_code

    def running(self, now: float) -> bool:
        return not self.removed and now < self.ends_at

    def handle(self, node: str) -> Handle:
        return {
            "runtime": "simulated",
            "node": node,
            "name": self.name,
            "workload_id": self.workload_id,
            "tenant": self.tenant,
            "attempt": self.attempt,
            "replica": self.replica,
            "started_at": self.started_at,
            "duration": self.duration,
            "exit_code": self.exit_code,
            "utilization": self.utilization,
            "log_interval": self.log_interval,
            "gpu_uuids": list(self.gpu_uuids),
        }

    @classmethod
    def from_handle(cls, handle: Handle) -> _Workload:
        try:
            return cls(
                name=str(handle["name"]),
                workload_id=str(handle["workload_id"]),
                tenant=str(handle["tenant"]),
                attempt=int(handle["attempt"]),
                replica=int(handle["replica"]),
                started_at=float(handle["started_at"]),
                duration=float(handle["duration"]),
                exit_code=int(handle["exit_code"]),
                utilization=float(handle["utilization"]),
                log_interval=float(handle["log_interval"]),
                gpu_uuids=tuple(handle.get("gpu_uuids") or ()),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise PermanentDriverError("not a simulated runtime handle", code="invalid_handle") from error


# Node name -> workload name -> workload; shared by the runtime and probe of a node in this process.
_registry: dict[str, dict[str, _Workload]] = {}
_registry_lock = threading.Lock()


def _node_workloads(node: str) -> dict[str, _Workload]:
    with _registry_lock:
        return _registry.setdefault(node, {})


def _number(labels: Mapping[str, str], key: str, default: float, low: float, high: float) -> float:
    raw = labels.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not low <= value <= high:
        raise PermanentDriverError(f"label {key}={raw!r} must be a number in [{low:g}, {high:g}]", code="invalid_value")
    return value


def _raise_injected(code: str | None) -> None:
    if code is None:
        return
    message = f"simulated start failure ({code})"
    if code == "timeout":
        raise DriverTimeout(message)
    if code == "engine_unreachable":
        raise TransientDriverError(message, code=code)
    raise PermanentDriverError(message, code=code)


def _log_text(name: str, index: int) -> tuple[Stream, str]:
    """Return the (stream, text) of synthetic line `index`: training steps, every tenth a warning on stderr."""
    noise = (zlib.crc32(f"{name}/{index}".encode()) % 1000) / 20000
    if index % 10 == 9:
        return "stderr", f"warning: step {index} took longer than expected"
    return "stdout", f"step {index} loss={2.0 * math.exp(-index / 50) + noise:.4f}"


class SimulatedRuntime:
    """Pretends to run workloads on node `node_name`; `clock` (seconds since the epoch) is injectable for tests."""

    kind = "simulated"

    def __init__(
        self, node_name: str, *, clock: Clock = time.time, cpus: int = 128, memory_mb: int = 2_064_384
    ) -> None:
        self.node = node_name
        self.clock = clock
        self.cpus = cpus
        self.memory_mb = memory_mb

    def _workload(self, handle: Handle) -> _Workload:
        if handle.get("runtime") != "simulated" or handle.get("node") != self.node:
            raise PermanentDriverError(f"not a simulated handle of node {self.node}", code="invalid_handle")
        known = _node_workloads(self.node).get(str(handle.get("name")))
        return known if known is not None else _Workload.from_handle(handle)

    def start(self, spec: WorkloadSpec, *, timeout: float = DEFAULT_TIMEOUT) -> Handle:
        """Register `spec` as started now, or adopt the registered workload of that name; return its handle.

        Nothing runs, so a service port gets no endpoint. Raises
        PermanentDriverError for a refused environment or service port, a
        bad `simulate.*` label or a name held by another workload.
        """
        policy.check_environment(spec.env)
        policy.check_service_port(spec.service_port, spec.service_port_env)
        policy.check_workload_name(spec.name)
        _raise_injected(spec.labels.get(START_ERROR_LABEL))
        health_check = spec.labels.get(policy.LABEL_PURPOSE) == "health-check"
        default_duration = HEALTH_CHECK_DURATION if health_check else DEFAULT_DURATION
        candidate = _Workload(
            name=spec.name,
            workload_id=spec.workload_id,
            tenant=spec.tenant,
            attempt=spec.attempt,
            replica=spec.replica,
            started_at=self.clock(),
            duration=_number(spec.labels, DURATION_LABEL, default_duration, 0, 10**9),
            exit_code=int(_number(spec.labels, EXIT_CODE_LABEL, 0, 0, 255)),
            utilization=_number(spec.labels, UTILIZATION_LABEL, 90, 0, 100),
            log_interval=_number(spec.labels, LOG_INTERVAL_LABEL, 1.0, 0.001, 86400),
            gpu_uuids=tuple(spec.gpu_uuids),
        )
        workloads = _node_workloads(self.node)
        with _registry_lock:
            existing = workloads.get(spec.name)
            if existing is None or existing.removed:
                workloads[spec.name] = existing = candidate
        identity = (existing.workload_id, existing.tenant, existing.attempt, existing.replica)
        if identity != (spec.workload_id, spec.tenant, spec.attempt, spec.replica):
            raise PermanentDriverError(f"{spec.name} belongs to another workload", code="name_conflict")
        return existing.handle(self.node)

    def poll(self, handle: Handle, *, timeout: float = DEFAULT_TIMEOUT) -> WorkloadStatus:
        """Return running until the declared duration has passed (or a stop), then exited with its code."""
        return self._status(self._workload(handle))

    def _status(self, workload: _Workload) -> WorkloadStatus:
        if workload.removed:
            return WorkloadStatus(state="missing")
        started = format_ns(int(workload.started_at * 1e9))
        utilization = workload.utilization / 100 * max(len(workload.gpu_uuids), 1)
        if workload.running(self.clock()):
            cpu = (self.clock() - workload.started_at) * utilization
            return WorkloadStatus(state="running", started_at=started, cpu_seconds=cpu, memory_bytes=512 * 2**20)
        finished = format_ns(int(workload.ends_at * 1e9))
        return WorkloadStatus(state="exited", exit_code=workload.final_code, started_at=started, finished_at=finished)

    def stop(self, handle: Handle, *, grace_seconds: float = 30.0, timeout: float = DEFAULT_TIMEOUT) -> WorkloadStatus:
        """End the workload now (exit code 143, as after SIGTERM) unless it has ended; idempotent."""
        workload = self._workload(handle)
        now = self.clock()
        with _registry_lock:
            _registry.setdefault(self.node, {})[workload.name] = workload
            if workload.running(now):
                workload.stopped_at = now
        return self._status(workload)

    def remove(self, handle: Handle, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Forget the workload: later polls say `missing`."""
        workload = self._workload(handle)
        with _registry_lock:
            _registry.setdefault(self.node, {})[workload.name] = workload
            workload.stopped_at = workload.stopped_at or self.clock()
            workload.removed = True

    def logs(
        self, handle: Handle, *, since: str | None = None, follow: bool = False, timeout: float = DEFAULT_TIMEOUT
    ) -> Iterator[LogLine]:
        """Yield the synthetic lines written so far, after cursor `since` (a line number); `follow` waits for more.

        One line per log interval from the start, and a last line with the
        exit code once ended. With `follow`, raises DriverTimeout if the
        workload still runs after `timeout` seconds.
        """
        workload = self._workload(handle)
        if workload.removed:
            raise PermanentDriverError(f"no workload {workload.name}", code="not_found")
        if since is not None and not since.isdigit():
            raise PermanentDriverError(f"invalid log cursor {since!r}", code="invalid_cursor")
        return self._lines(workload, int(since) + 1 if since is not None else 0, follow, self.clock() + timeout)

    def _lines(self, workload: _Workload, index: int, follow: bool, deadline: float) -> Iterator[LogLine]:
        steps = math.ceil(workload.duration / workload.log_interval)
        while True:
            now = min(self.clock(), workload.ends_at)
            written = min(math.floor((now - workload.started_at) / workload.log_interval) + 1, steps)
            for line in range(index, written):
                stream, text = _log_text(workload.name, line)
                yield self._line(workload.started_at + line * workload.log_interval, stream, text, line)
            index = max(index, written)
            if not workload.running(self.clock()):
                if index <= steps:
                    yield self._line(workload.ends_at, "stdout", f"exited with code {workload.final_code}", steps)
                return
            if not follow:
                return
            if self.clock() >= deadline:
                raise DriverTimeout(f"{workload.name} still runs; resume from the last cursor")
            next_line = workload.started_at + index * workload.log_interval
            time.sleep(max(0.0, min(next_line, workload.ends_at, deadline) - self.clock()) + 0.001)

    @staticmethod
    def _line(at: float, stream: Stream, text: str, index: int) -> LogLine:
        return LogLine(timestamp=format_ns(int(at * 1e9)), stream=stream, text=text, cursor=str(index))

    def list_managed(self, *, timeout: float = DEFAULT_TIMEOUT) -> list[ManagedWorkload]:
        """Return the workloads this process has started on the node and not removed."""
        with _registry_lock:
            workloads = [w for w in _registry.get(self.node, {}).values() if not w.removed]
        return [
            ManagedWorkload(
                w.name, w.workload_id, w.tenant, w.attempt, w.replica, self._status(w).state, w.handle(self.node)
            )
            for w in workloads
        ]

    def info(self, *, timeout: float = DEFAULT_TIMEOUT) -> RuntimeInfo:
        """Return a simulated engine: isolated, GPU-capable, `simulated=True`."""
        return RuntimeInfo(
            kind=self.kind,
            isolated=True,
            simulated=True,
            engine_version="simulated",
            nvidia_runtime=True,
            device_requests=True,
            cpus=self.cpus,
            memory_mb=self.memory_mb,
        )


# --- GPU probe ---------------------------------------------------------------------


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
        memory_mb: int = 81559,
        seed: int | None = None,
        *,
        clock: Clock = time.time,
    ) -> None:
        self.node = node_name
        self.model = model
        self.memory_mb = memory_mb
        self.clock = clock
        self._random = random.Random(zlib.crc32(node_name.encode()) if seed is None else seed)  # noqa: S311 -- not security
        self._max_power = _max_power(model)
        self._gpus = [
            _GpuState(GpuInfo(index=i, uuid=simulated_uuid(node_name, i), model=model, memory_mb=memory_mb))
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
        with _registry_lock:
            running = [w for w in _registry.get(self.node, {}).values() if w.gpu_uuids and w.running(now)]
        load: dict[str, tuple[float, list[GpuProcess]]] = {}
        for workload in running:
            pid = 10_000 + zlib.crc32(workload.name.encode()) % 50_000
            for gpu_uuid in workload.gpu_uuids:
                busy, processes = load.get(gpu_uuid, (0.0, []))
                used = int(self.memory_mb * 0.6 * workload.utilization / 100)
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
            sum(p.used_memory_mb or 0 for p in processes)
            if gpu.utilization is None
            else int(0.6 * share * self.memory_mb)
        )
        return GpuSample(
            uuid=gpu.info.uuid,
            index=gpu.info.index,
            timestamp=now,
            utilization_gpu=round(utilization, 1),
            utilization_memory=round(utilization * 0.6, 1),
            memory_used_mb=min(used + 4, self.memory_mb),
            memory_total_mb=self.memory_mb,
            temperature_c=round(31 + 45 * share + self._random.uniform(-0.5, 0.5), 1),
            power_w=round(70 + (self._max_power - 70) * share + self._random.uniform(-3, 3), 1),
            sm_clock_mhz=1980 if share > 0.05 else 345,
            ecc_corrected=gpu.ecc_corrected,
            ecc_uncorrected=gpu.ecc_uncorrected,
            xid_events=xids,
            processes=list(processes),
        )
