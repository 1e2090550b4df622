"""Prometheus metrics of the workloads: queue and running work per pool, GPUs held per tenant, pass durations.

Counts are read from the ledger at scrape time (set-based, a fixed number
of queries), so every web process answers the same. Scheduling passes run
in controller workers, not in the web process Prometheus scrapes, so their
durations are recorded into Django's cache (`record_pass_duration`), which
all processes share: Redis in distributed mode, process memory in embedded
mode where everything is one process. The histogram keeps one counter per
bucket and the sum; they live until Redis is flushed (or, embedded, the
process restarts), which Prometheus reads as a counter reset.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator
from functools import cached_property

from django.core.cache import cache
from django.db.models import Count
from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from inventory.metrics import GpuHolder
from inventory.models import NodePool
from jobs.choices import TERMINAL_STATES, WorkloadState
from jobs.models import Allocation, Workload

log = logging.getLogger(__name__)

# Upper bounds (seconds) of the pass-duration buckets; a pass longer than the last lands in +Inf.
PASS_DURATION_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_CACHE_PREFIX = "metrics:scheduling-pass"
# The sum is kept in whole microseconds: cache counters (Redis INCRBY) are integers.
_SUM_KEY = f"{_CACHE_PREFIX}:sum-us"
# The states of workloads not ended yet: the only ones gpucloud_workloads counts.
NOT_ENDED: tuple[WorkloadState, ...] = tuple(state for state in WorkloadState if state not in TERMINAL_STATES)


def _bucket_key(index: int) -> str:
    # Index len(PASS_DURATION_BUCKETS) is the +Inf bucket. Counters are per bucket, summed when read,
    # so a pass costs two increments rather than one per bucket.
    return f"{_CACHE_PREFIX}:bucket:{index}"


def _increment(key: str, delta: int) -> None:
    try:
        cache.incr(key, delta)
    except ValueError:  # the key does not exist yet: `add` creates it once, whoever races here
        cache.add(key, 0, timeout=None)
        cache.incr(key, delta)


def record_pass_duration(seconds: float) -> None:
    """Count one scheduling pass of `seconds` in the shared pass-duration histogram; never raises.

    A pass has already committed when this runs: a cache outage loses the
    observation (logged), never the pass.
    """
    try:
        _increment(_bucket_key(bisect_left(PASS_DURATION_BUCKETS, seconds)), 1)
        _increment(_SUM_KEY, round(max(seconds, 0.0) * 1_000_000))
    except Exception:
        log.warning("could not record a scheduling pass duration of %.3f s", seconds, exc_info=True)


def pass_duration_histogram() -> HistogramMetricFamily:
    """Return the pass-duration histogram as stored in the cache (cumulative buckets, sum, count); one cache read."""
    keys = [_bucket_key(index) for index in range(len(PASS_DURATION_BUCKETS) + 1)]
    stored = cache.get_many([*keys, _SUM_KEY])
    bounds = [floatToGoString(bound) for bound in PASS_DURATION_BUCKETS] + ["+Inf"]
    cumulative, buckets = 0, []
    for bound, key in zip(bounds, keys, strict=True):
        cumulative += int(stored.get(key, 0))
        buckets.append((bound, float(cumulative)))
    return HistogramMetricFamily(
        "gpucloud_scheduling_pass_duration_seconds",
        "Duration of the scheduling passes that ran (snapshot, core and commit), across all controller workers.",
        buckets=buckets,
        sum_value=int(stored.get(_SUM_KEY, 0)) / 1_000_000,
    )


class ActiveGpuAllocations:
    """One scrape's read of the GPUs held now (looks across tenants: the endpoint is for operators).

    Read once, on first use, and shared by the GPU readings (whose labels
    name the holder) and the per-tenant allocation counts.
    """

    @cached_property
    def rows(self) -> list[tuple[int, str, str, int, str]]:
        """(GPU id, tenant slug, project slug, workload id, pool name) of every active GPU allocation; one query."""
        active = Allocation.all_tenants.filter(released_at__isnull=True, gpu__isnull=False)
        return list(
            active.values_list("gpu_id", "tenant__slug", "workload__project__slug", "workload_id", "node__pool__name")
        )

    def holders(self) -> dict[int, GpuHolder]:
        """Return {GPU id: who holds it}."""
        return {gpu: GpuHolder(tenant=t, project=p, workload=w) for gpu, t, p, w, _ in self.rows}

    def per_pool_and_tenant(self) -> Counter[tuple[str, str]]:
        """Return {(pool, tenant slug): GPUs held}."""
        return Counter((pool, tenant) for _, tenant, _, _, pool in self.rows)


def workload_counts() -> dict[tuple[str, str], int]:
    """Return {(pool, state): n} over workloads not ended, every pool and live state present (0 when none).

    Ended workloads are left out: their number only grows with history, and
    counting them would scan it at every scrape. Two queries.
    """
    counts = {(pool, state.value): 0 for pool in NodePool.objects.values_list("name", flat=True) for state in NOT_ENDED}
    rows = (
        Workload.all_tenants.filter(state__in=NOT_ENDED)
        .values("pool__name", "state")
        .annotate(n=Count("id"))
        .order_by()
    )
    counts.update({(row["pool__name"], row["state"]): row["n"] for row in rows})
    return counts


class JobsCollector(Collector):
    """Workloads per pool and state, GPUs held per pool and tenant, and the pass-duration histogram."""

    def __init__(self, *, allocations: ActiveGpuAllocations) -> None:
        self.allocations = allocations

    def collect(self) -> Iterator[Metric]:
        workloads = GaugeMetricFamily(
            "gpucloud_workloads", "Workloads not ended, by pool and state (pending: waiting in the queue).",
            labels=["pool", "state"],
        )  # fmt: skip
        for (pool, state), n in sorted(workload_counts().items()):
            workloads.add_metric([pool, state], n)
        yield workloads
        allocated = GaugeMetricFamily(
            "gpucloud_allocated_gpus", "GPUs held by workloads now, by pool and tenant.", labels=["pool", "tenant"]
        )
        for (pool, tenant), n in sorted(self.allocations.per_pool_and_tenant().items()):
            allocated.add_metric([pool, tenant], n)
        yield allocated
        yield pass_duration_histogram()
