"""The provisioning health check: run one short workload on a node and report how it ended."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections import deque

from inventory.drivers.base import (
    DriverError,
    RemovableRuntime,
    Resources,
    Runtime,
    WorkloadSpec,
    WorkloadStatus,
)
from inventory.drivers.policy import LABEL_PURPOSE

log = logging.getLogger(__name__)

HEALTH_CHECK_TENANT = "gpucloud.health"
"""Tenant of health-check workloads: a name no tenant slug can take (slugs have no dots)."""
HEALTH_CHECK_PURPOSE = "health-check"
_TAIL_LINES = 3
_POLL_INTERVAL = 0.05
_MAX_POLL_INTERVAL = 0.5
_ENGINE_TIMEOUT = 30.0
"""Seconds one engine call (start) may take: apart from the check's own run time,
so that a slow engine on a busy host is not mistaken for a check that overran."""


def run_health_check(
    runtime: Runtime, *, installation: str, image: str, command: list[str], gpu_uuids: list[str], timeout: float
) -> WorkloadStatus:
    """Run `command` in `image` with `gpu_uuids` once, wait for it to exit, remove it and return its status.

    The workload is uniquely named (`gpucloud-health-<hex>`) and labelled
    `gpucloud.purpose=health-check`; it is `installation`'s (the Docker
    runtime puts it on that console's own health network). A non-zero exit carries the last
    lines of output in `message`. When it is still running at `timeout`
    it is killed and the returned status says so; `timeout` counts from
    the moment it started, not from the request to start it. Raises
    DriverError when the runtime refuses or cannot start it.
    """
    token = uuid.uuid4().hex[:12]
    spec = WorkloadSpec(
        name=f"gpucloud-health-{token}",
        workload_id=f"health-{token}",
        tenant=HEALTH_CHECK_TENANT,
        attempt=0,
        installation=installation,
        image=image,
        command=list(command),
        gpu_uuids=list(gpu_uuids),
        resources=Resources(cpu_milli=1000, memory_mib=512, pids=256),
        labels={LABEL_PURPOSE: HEALTH_CHECK_PURPOSE},
    )
    handle = runtime.start(spec, timeout=max(timeout, _ENGINE_TIMEOUT))
    deadline = time.monotonic() + timeout
    try:
        status = _wait(runtime, handle, deadline)
        if status.state != "exited":
            status = runtime.stop(handle, grace_seconds=0, timeout=10.0)
            return dataclasses.replace(status, message=f"the health check did not finish within {timeout:g} s")
        if status.exit_code != 0 and not status.message:
            status = dataclasses.replace(status, message=_tail(runtime, handle))
        return status
    finally:
        _remove(runtime, handle)


def _wait(runtime: Runtime, handle: dict[str, object], deadline: float) -> WorkloadStatus:
    interval = _POLL_INTERVAL
    while True:
        left = deadline - time.monotonic()
        status = runtime.poll(handle, timeout=max(min(left, 10.0), 1.0))
        if status.state in ("exited", "missing") or left <= 0:
            return status
        time.sleep(min(interval, max(left, 0)))
        interval = min(interval * 2, _MAX_POLL_INTERVAL)


def _tail(runtime: Runtime, handle: dict[str, object]) -> str:
    try:
        lines = deque((line.text for line in runtime.logs(handle, timeout=10.0)), maxlen=_TAIL_LINES)
    except DriverError:
        return ""
    return " | ".join(lines)


def _remove(runtime: Runtime, handle: dict[str, object]) -> None:
    if not isinstance(runtime, RemovableRuntime):
        return
    try:
        runtime.remove(handle, timeout=10.0)
    except DriverError:
        # The result stands; a leftover is listed by list_managed and cleaned up by reconciliation.
        log.warning("could not remove health-check workload %s", handle.get("name"), exc_info=True)
