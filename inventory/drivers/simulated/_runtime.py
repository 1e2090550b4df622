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

The probe (`_probe`, re-exported here) follows the workloads
running on its node's GPUs, or a utilization set by hand, and takes
injected faults (XID, uncorrected ECC, lost GPU) so GPU health can be
exercised without hardware. The workload records and their registry are
in `_workloads`.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Iterator, Mapping

from inventory.drivers import policy
from inventory.drivers.base import (
    DEFAULT_TIMEOUT,
    DriverTimeout,
    Handle,
    LogLine,
    ManagedWorkload,
    PermanentDriverError,
    PullListener,
    RuntimeInfo,
    Stream,
    TransientDriverError,
    WorkloadSpec,
    WorkloadStatus,
)
from inventory.drivers.simulated._probe import CUDA_VERSION, DRIVER_VERSION, SimulatedProbe, simulated_uuid
from inventory.drivers.simulated._workloads import (
    SIGTERM_EXIT_CODE,
    Clock,
    SimulatedWorkload,
    node_workloads,
    registry,
    registry_lock,
)
from inventory.drivers.timestamps import format_ns

__all__ = [
    "CUDA_VERSION",
    "DEFAULT_DURATION",
    "DRIVER_VERSION",
    "DURATION_LABEL",
    "EXIT_CODE_LABEL",
    "HEALTH_CHECK_DURATION",
    "LOG_INTERVAL_LABEL",
    "SIGTERM_EXIT_CODE",
    "START_ERROR_LABEL",
    "UTILIZATION_LABEL",
    "Clock",
    "SimulatedProbe",
    "SimulatedRuntime",
    "simulated_uuid",
]

DURATION_LABEL = "simulate.duration_seconds"
EXIT_CODE_LABEL = "simulate.exit_code"
UTILIZATION_LABEL = "simulate.utilization"
LOG_INTERVAL_LABEL = "simulate.log_interval_seconds"
START_ERROR_LABEL = "simulate.start_error"
DEFAULT_DURATION = 60.0
HEALTH_CHECK_DURATION = 0.2


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
        self, node_name: str, *, clock: Clock = time.time, cpu_cores: int = 128, memory_mib: int = 2_064_384
    ) -> None:
        self.node = node_name
        self.clock = clock
        self.cpu_cores = cpu_cores
        self.memory_mib = memory_mib

    def _workload(self, handle: Handle) -> SimulatedWorkload:
        if handle.get("runtime") != "simulated" or handle.get("node") != self.node:
            raise PermanentDriverError(f"not a simulated handle of node {self.node}", code="invalid_handle")
        known = node_workloads(self.node).get(str(handle.get("name")))
        return known if known is not None else SimulatedWorkload.from_handle(handle)

    def start(
        self, spec: WorkloadSpec, *, timeout: float = DEFAULT_TIMEOUT, on_pull: PullListener | None = None
    ) -> Handle:
        """Register `spec` as started now, or adopt the registered workload of that name; return its handle.

        Nothing runs, so a service port gets no endpoint. Raises
        PermanentDriverError for a refused environment or service port, a
        bad `simulate.*` label or a name held by another workload. Nothing is pulled: `on_pull` is never called.
        """
        policy.check_environment(spec.env)
        policy.check_service_port(spec.service_port, spec.service_port_env)
        policy.check_workload_name(spec.name)
        _raise_injected(spec.labels.get(START_ERROR_LABEL))
        health_check = spec.labels.get(policy.LABEL_PURPOSE) == "health-check"
        default_duration = HEALTH_CHECK_DURATION if health_check else DEFAULT_DURATION
        candidate = SimulatedWorkload(
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
            installation=spec.installation,
        )
        workloads = node_workloads(self.node)
        with registry_lock:
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

    def _status(self, workload: SimulatedWorkload) -> WorkloadStatus:
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
        with registry_lock:
            registry.setdefault(self.node, {})[workload.name] = workload
            if workload.running(now):
                workload.stopped_at = now
        return self._status(workload)

    def remove(self, handle: Handle, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Forget the workload: later polls say `missing`."""
        workload = self._workload(handle)
        with registry_lock:
            registry.setdefault(self.node, {})[workload.name] = workload
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

    def _lines(self, workload: SimulatedWorkload, index: int, follow: bool, deadline: float) -> Iterator[LogLine]:
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
        with registry_lock:
            workloads = [w for w in registry.get(self.node, {}).values() if not w.removed]
        return [
            ManagedWorkload(
                w.name,
                w.workload_id,
                w.tenant,
                w.attempt,
                w.replica,
                self._status(w).state,
                w.handle(self.node),
                installation=w.installation,
                node=self.node if w.installation else "",
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
            cpu_cores=self.cpu_cores,
            memory_mib=self.memory_mib,
        )
