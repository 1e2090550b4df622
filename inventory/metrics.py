"""Prometheus metrics of the fleet: GPU readings under the DCGM exporter's names, node and GPU counts.

Everything is read from the ledger at scrape time (a Prometheus custom
collector), so every web process answers the same thing and nothing is
counted per process. The reads are set-based: a scrape costs the same
number of queries for ten GPUs or ten thousand.

GPU series use dcgm-exporter's names and labels (`gpu` index, `UUID`,
`device` nvidiaN, `modelName`, `Hostname`) so dashboards written for it
work, plus ours: `pool`, and `tenant`, `project`, `workload` (id) of the
workload holding the GPU, empty when the GPU is idle. Who holds a GPU is
the jobs app's knowledge, which inventory may not import: the caller passes
it in as `holders`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inventory.choices import NodeState
from inventory.models import Gpu, Node, NodePool

# A row of a values() query: column name to value.
Row = Mapping[str, Any]

DCGM_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "pool", "tenant", "project", "workload"]


@dataclass(frozen=True)
class GpuHolder:
    """Who holds one GPU now: tenant and project slugs and the workload's id."""

    tenant: str
    project: str
    workload: int


IDLE = GpuHolder(tenant="", project="", workload=0)


@dataclass(frozen=True)
class _Reading:
    """One DCGM field: the metric name, its help text, and how to read its value from a GPU row."""

    name: str
    documentation: str
    read: Callable[[Row], float | None]


def _number(value: Any) -> float | None:
    # Samples are JSON an agent sent: anything that is not a real number is "unknown", never an error.
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _sampled(key: str) -> Callable[[Row], float | None]:
    return lambda row: _number((row["last_sample"] or {}).get(key))


def _framebuffer_free(row: Row) -> float | None:
    total = _number((row["last_sample"] or {}).get("memory_total_mib")) or _number(row["memory_mib"]) or None
    used = _number(row["memory_used_mib"])
    return None if total is None or used is None else max(total - used, 0.0)


def _last_xid(row: Row) -> float | None:
    # DCGM reports the value of the last XID error; a sample lists the XIDs seen since the previous one.
    xids = [_number(x) for x in (row["last_sample"] or {}).get("xid_events") or []]
    known = [x for x in xids if x is not None]
    return known[-1] if known else 0.0


READINGS: tuple[_Reading, ...] = (
    _Reading("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda row: _number(row["utilization"])),
    _Reading("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", _sampled("utilization_memory")),
    _Reading("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda row: _number(row["memory_used_mib"])),
    _Reading("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _framebuffer_free),
    _Reading("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", _sampled("power_w")),
    _Reading("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", _sampled("temperature_c")),
    _Reading("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", _sampled("sm_clock_mhz")),
    _Reading("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error in the latest sample (0: none).", _last_xid),
    # DCGM types these two as counters; they are gauges here because the client library would
    # append `_total` to a counter's name, which already ends in _TOTAL. rate() works on either.
    _Reading("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Single-bit volatile ECC errors (corrected).", _sampled("ecc_corrected")),
    _Reading(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Double-bit volatile ECC errors (uncorrected).", _sampled("ecc_uncorrected")
    ),
)


def sample_max_age() -> timedelta:
    """Return how old a GPU's latest sample may be and still count as current.

    The heartbeat timeout: a node silent that long is declared unreachable,
    and its last readings describe the past, not the GPU now.
    """
    return timedelta(seconds=settings.NODE_HEARTBEAT_TIMEOUT_SECONDS)


def fresh_gpu_readings(*, now: datetime) -> list[Row]:
    """Return one dict per present GPU whose latest sample is current, with its node and pool names; one query."""
    rows = Gpu.objects.filter(present=True, last_sample_at__gte=now - sample_max_age()).exclude(
        node__state=NodeState.RETIRED
    )
    return list(
        rows.order_by("node__name", "index").values(
            "id",
            "index",
            "uuid",
            "model",
            "memory_mib",
            "utilization",
            "memory_used_mib",
            "last_sample",
            "node__name",
            "node__pool__name",
        )
    )


def gpu_counts() -> list[Row]:
    """Return [{pool, model, health, n}] over present GPUs of nodes not retired; one query."""
    rows = Gpu.objects.filter(present=True).exclude(node__state=NodeState.RETIRED)
    return list(rows.values("node__pool__name", "model", "health").annotate(n=Count("id")).order_by())


def node_rows() -> list[Row]:
    """Return [{name, pool, state, last heartbeat}] of every node; one query."""
    return list(Node.objects.order_by("name").values("name", "pool__name", "state", "last_heartbeat_at"))


def pool_names() -> list[str]:
    """Return every pool's name; one query."""
    return list(NodePool.objects.order_by("name").values_list("name", flat=True))


class InventoryCollector(Collector):
    """DCGM GPU readings and the fleet's node and GPU counts, read from the ledger at each scrape.

    `holders` returns {GPU id: GpuHolder} for the GPUs held now; GPUs it does
    not name are idle.
    """

    def __init__(self, *, holders: Callable[[], Mapping[int, GpuHolder]]) -> None:
        self.holders = holders

    def collect(self) -> Iterator[Metric]:
        yield from self._gpu_readings()
        yield self._gpus()
        yield from self._nodes()

    def _gpu_readings(self) -> Iterator[Metric]:
        rows = fresh_gpu_readings(now=timezone.now())
        holders = self.holders()
        families = [
            (reading, GaugeMetricFamily(reading.name, reading.documentation, labels=DCGM_LABELS))
            for reading in READINGS
        ]
        for row in rows:
            labels = _dcgm_labels(row, holders.get(row["id"], IDLE))
            for reading, family in families:
                value = reading.read(row)
                if value is not None:
                    family.add_metric(labels, value)
        yield from (family for _, family in families)

    def _gpus(self) -> Metric:
        family = GaugeMetricFamily(
            "gpucloud_gpus",
            "GPUs present on nodes not retired, by pool, model and health.",
            labels=["pool", "model", "health"],
        )
        for row in gpu_counts():
            family.add_metric([row["node__pool__name"], row["model"], row["health"]], row["n"])
        return family

    def _nodes(self) -> Iterator[Metric]:
        nodes = node_rows()
        # Every pool and state is listed, so a state no node is in reads 0 rather than "no data".
        counts = Counter({(pool, state.value): 0 for pool in pool_names() for state in NodeState})
        heartbeats = GaugeMetricFamily(
            "gpucloud_node_last_heartbeat_timestamp_seconds",
            "When each node's agent last reported (Unix time); absent for nodes that never did and retired ones.",
            labels=["node", "pool"],
        )
        for node in nodes:
            counts[(node["pool__name"], node["state"])] += 1
            if node["last_heartbeat_at"] is not None and node["state"] != NodeState.RETIRED:
                heartbeats.add_metric([node["name"], node["pool__name"]], node["last_heartbeat_at"].timestamp())
        states = GaugeMetricFamily("gpucloud_nodes", "Nodes by pool and lifecycle state.", labels=["pool", "state"])
        for (pool, state), n in sorted(counts.items()):
            states.add_metric([pool, state], n)
        yield states
        yield heartbeats


def _dcgm_labels(row: Row, holder: GpuHolder) -> list[str]:
    return [
        str(row["index"]),
        row["uuid"],
        f"nvidia{row['index']}",
        row["model"],
        row["node__name"],
        row["node__pool__name"],
        holder.tenant,
        holder.project,
        str(holder.workload) if holder.workload else "",
    ]
