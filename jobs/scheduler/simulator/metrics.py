"""What a simulation measures, and the independent checks it runs after every pass.

Definitions (stated so that they can be argued with, not tuned):
- completion time (JCT): finish - submission;
- wait: the time a job spent pending, i.e. before its first start plus,
  after each preemption, until it started again (the work it redoes after
  a preemption counts in its JCT, not in its wait); `wait_by_size` splits it
  by the job's total GPUs (1, 2-8, more than 8);
- a job still running at its time limit is killed there: it counts as
  finished (its JCT ends at the kill) and in `killed_at_limit`, and the run
  time it still needed in `killed_gpu_hours_cut`;
- ETA error: for a job that waited, |estimated start - actual first start|
  / (actual first start - submission), the estimate being the core's
  (`Decisions.estimates`) at the first pass that left it waiting; null when
  the core gave no estimate at all (or the run did not ask for them);
  `eta_miss_p50_s` and `eta_miss_p90_s` give the same misses in seconds (a
  job that waited a minute and was told an hour is off by 59x, or 59 min);
- prediction error: |predicted - actual run time| / actual run time, with
  the prediction the job had at its first start, over the jobs that had
  one (`predicted_share` of the started jobs);
- GPU allocation: allocated GPUs / cluster GPUs, averaged over time from the
  first arrival to the last event;
- fair share of a tenant at an instant: water-filling of the cluster over the
  tenants' guarantees, limits and weights, capped by their demand (running +
  pending GPUs); "received vs fair" compares the time integrals of allocated
  GPUs and of that fair share;
- Jain's index over tenants of x_i = received_i / fair_i (tenants with a
  non-zero fair share): 1 when every tenant got the same fraction of its
  entitlement;
- quota violations: (pass, owner) pairs holding more GPUs than their limit,
  plus any GPU held by two workloads at once, counted from the simulator's
  own books after every pass, not from the core's;
- GPU-hours lost to preemption: for every preemption, the victim's GPUs x
  (its run time since its latest checkpoint of the attempt, the progress
  it must redo, + the restart overhead it pays when it starts again),
  reported as both parts and their sum.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs.scheduler.core import Snapshot, TenantQuota, Workload
from jobs.scheduler.core.fairshare import Claim, water_fill
from jobs.scheduler.simulator.traces import TraceJob


def check_quotas(snapshot: Snapshot, running: Iterable[Workload], quotas: Iterable[TenantQuota]) -> int:
    """Return how many owners exceed their limit and how many GPUs are held twice, given what now runs."""
    gpus: Counter[str] = Counter()
    tenant_usage: Counter[tuple[str, str]] = Counter()
    project_usage: Counter[tuple[str, str, str]] = Counter()
    for workload in running:
        tenant_usage[(workload.pool, workload.tenant)] += workload.total_gpus
        project_usage[(workload.pool, workload.tenant, workload.project)] += workload.total_gpus
        for replica in workload.allocation:
            gpus.update(replica.gpu_uuids)
    limits = {(q.pool, q.tenant): q.limit for q in quotas}
    project_limits = {(q.pool, q.tenant, q.project): q.limit for q in snapshot.project_quotas}
    over = sum(1 for key, used in tenant_usage.items() if used > limits.get(key, 0))
    over += sum(1 for key, used in project_usage.items() if key in project_limits and used > project_limits[key])
    return over + sum(1 for count in gpus.values() if count > 1)


def percentile(values: list[float], fraction: float) -> float:
    """Return the nearest-rank percentile of `values` (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


@dataclass
class Series:
    """Per-tenant allocation and queue length after each pass, for the plot."""

    times: list[float] = field(default_factory=list)
    allocated: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    queued: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))


@dataclass
class Result:
    """The measured outcome of one simulation."""

    summary: dict[str, Any]
    series: Series

    def as_json(self) -> dict[str, Any]:
        """Return the summary (what the JSON file holds)."""
        return self.summary


class Recorder:
    """Accumulates metrics as the simulation runs."""

    def __init__(self, capacity: int, quotas: tuple[TenantQuota, ...], jobs: Mapping[str, TraceJob]) -> None:
        self.capacity = capacity
        self.quotas = {q.tenant: q for q in quotas}
        self.jobs = jobs
        self.tenants = sorted({job.tenant for job in jobs.values()})
        self.finished_at: dict[str, float] = {}
        self.killed: dict[str, float] = {}  # job id -> run seconds it still needed when killed
        self.preemptions = 0
        self.preempted_count: Counter[str] = Counter()
        self.lost_progress_gpu_s = 0.0
        self.restart_gpu_s = 0.0
        self.violations = 0
        self.series = Series()
        self.first_time: float | None = None
        self.last_time = 0.0
        self.current_allocated: dict[str, int] = {}
        self.current_fair: dict[str, float] = {}
        self.received: dict[str, float] = defaultdict(float)
        self.entitled: dict[str, float] = defaultdict(float)
        self.allocated_integral = 0.0
        self.pending_since: dict[str, float] = {}
        self.waited: dict[str, float] = defaultdict(float)
        self.first_start: dict[str, float] = {}
        self.estimates: dict[str, float | None] = {}
        self.eta_errors: list[float] = []
        self.eta_misses_s: list[float] = []
        self.prediction_errors: list[float] = []

    def arrived(self, job_id: str, now: float) -> None:
        """Note an arrival (the clock starts at the first): it waits from now."""
        if self.first_time is None:
            self.first_time = self.last_time = now
        self.pending_since[job_id] = now

    def estimated(self, job_id: str, start_at: float | None) -> None:
        """Note the start estimate of the first pass that left `job_id` waiting (None: that pass gave none)."""
        self.estimates.setdefault(job_id, start_at)

    def started(self, job_id: str, now: float, predicted_s: float | None = None) -> None:
        """Note a start: the wait since it was last queued ends; at its first, score its estimate and prediction."""
        self.waited[job_id] += now - self.pending_since.pop(job_id, now)
        if job_id in self.first_start:
            return
        self.first_start[job_id] = now
        job = self.jobs[job_id]
        estimate = self.estimates.get(job_id)
        if estimate is not None and now > job.submitted_at:
            self.eta_errors.append(abs(estimate - now) / (now - job.submitted_at))
            self.eta_misses_s.append(abs(estimate - now))
        if predicted_s is not None and job.duration_s > 0:
            self.prediction_errors.append(abs(predicted_s - job.duration_s) / job.duration_s)

    def preempted(self, job_id: str, now: float, lost_gpu_s: float = 0.0, restart_gpu_s: float = 0.0) -> None:
        """Count a preemption and the GPU-seconds of progress and of restart overhead it costs; it waits again."""
        self.preemptions += 1
        self.preempted_count[job_id] += 1
        self.lost_progress_gpu_s += lost_gpu_s
        self.restart_gpu_s += restart_gpu_s
        self.pending_since[job_id] = now

    def finished(self, job_id: str, now: float, unfinished_work_s: float | None = None) -> None:
        """Note a completion; `unfinished_work_s` set: killed at its limit with that much run time still needed."""
        self.finished_at[job_id] = now
        if unfinished_work_s is not None:
            self.killed[job_id] = unfinished_work_s

    def sample(self, now: float, running: Iterable[Any], pending: Iterable[Workload]) -> None:
        """Integrate the state since the last sample, then take the state after this pass."""
        elapsed = now - self.last_time
        for tenant, gpus in self.current_allocated.items():
            self.received[tenant] += gpus * elapsed
            self.allocated_integral += gpus * elapsed
        for tenant, share in self.current_fair.items():
            self.entitled[tenant] += share * elapsed
        self.last_time = now
        allocated: Counter[str] = Counter()
        for item in running:
            allocated[item.workload.tenant] += item.workload.total_gpus
        queued: Counter[str] = Counter()
        demand: Counter[str] = Counter(allocated)
        for workload in pending:
            queued[workload.tenant] += 1
            demand[workload.tenant] += workload.total_gpus
        self.current_allocated = dict(allocated)
        self.current_fair = water_fill(float(self.capacity), [self._claim(t, demand[t]) for t in self.tenants])
        self.series.times.append(now)
        for tenant in self.tenants:
            self.series.allocated[tenant].append(allocated[tenant])
            self.series.queued[tenant].append(queued[tenant])

    def _claim(self, tenant: str, demand: int) -> Claim:
        quota = self.quotas.get(tenant)
        if quota is None:
            return Claim(tenant, 0.0, 0.0, 0.0, float(demand))
        return Claim(tenant, float(quota.guaranteed), float(quota.limit), float(quota.weight), float(demand))

    def result(self, unfinished: int) -> Result:
        """Return the summary of everything recorded."""
        done = [self.jobs[j] for j in self.finished_at]
        jct = [self.finished_at[j.id] - j.submitted_at for j in done]
        wait = [self.waited[j.id] for j in done]
        span = self.last_time - (self.first_time or 0.0)
        ratios = {t: self.received[t] / self.entitled[t] for t in self.tenants if self.entitled[t] > 0}
        values = list(ratios.values())
        jain = sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if values else 1.0
        summary = {
            "jobs": len(self.jobs),
            "finished": len(done),
            "unfinished": unfinished,
            "killed_at_limit": len(self.killed),
            "gpus": self.capacity,
            "submitted_gpu_hours": round(sum(j.total_gpus * j.duration_s for j in self.jobs.values()) / 3600, 1),
            "killed_gpu_hours_cut": round(sum(self.jobs[j].total_gpus * s for j, s in self.killed.items()) / 3600, 1),
            "mean_jct_s": round(sum(jct) / len(jct), 1) if jct else 0.0,
            "p50_jct_s": round(percentile(jct, 0.5), 1),
            "p95_jct_s": round(percentile(jct, 0.95), 1),
            "mean_wait_s": round(sum(wait) / len(wait), 1) if wait else 0.0,
            "p95_wait_s": round(percentile(wait, 0.95), 1),
            "wait_by_size": wait_by_size(done, self.waited),
            "gpu_allocation_mean": round(self.allocated_integral / (self.capacity * span), 4) if span else 0.0,
            "jain_index": round(jain, 4),
            "preemptions": self.preemptions,
            "max_preemptions_one_job": max(self.preempted_count.values(), default=0),
            "lost_progress_gpu_hours": round(self.lost_progress_gpu_s / 3600, 1),
            "restart_overhead_gpu_hours": round(self.restart_gpu_s / 3600, 1),
            "preemption_lost_gpu_hours": round((self.lost_progress_gpu_s + self.restart_gpu_s) / 3600, 1),
            "quota_violations": self.violations,
            "makespan_s": round(span, 1),
            **self._estimates(),
            "tenants": {
                t: {
                    "guaranteed": self.quotas[t].guaranteed if t in self.quotas else 0,
                    "received_gpu_hours": round(self.received[t] / 3600, 1),
                    "fair_share_gpu_hours": round(self.entitled[t] / 3600, 1),
                    "received_over_fair": round(ratios[t], 4) if t in ratios else None,
                }
                for t in self.tenants
            },
        }
        return Result(summary, self.series)

    def _estimates(self) -> dict[str, float | None]:
        """Return the ETA and prediction errors (fractions; null where nothing was estimated or predicted)."""
        waited = sum(1 for j, t in self.first_start.items() if t > self.jobs[j].submitted_at)
        started = len(self.first_start)
        return {
            "eta_error_p50": _fraction(percentile(self.eta_errors, 0.5)) if self.eta_errors else None,
            "eta_error_p90": _fraction(percentile(self.eta_errors, 0.9)) if self.eta_errors else None,
            "eta_miss_p50_s": round(percentile(self.eta_misses_s, 0.5), 1) if self.eta_misses_s else None,
            "eta_miss_p90_s": round(percentile(self.eta_misses_s, 0.9), 1) if self.eta_misses_s else None,
            "eta_share": _fraction(len(self.eta_errors) / waited) if waited else None,
            "prediction_error_p50": _fraction(percentile(self.prediction_errors, 0.5))
            if self.prediction_errors
            else None,
            "predicted_share": _fraction(len(self.prediction_errors) / started) if started else None,
        }


def _fraction(value: float) -> float:
    return round(value, 4)


# Size classes of `wait_by_size`, by a job's total GPUs: (name, smallest, largest).
SIZE_CLASSES = (("1", 1, 1), ("2-8", 2, 8), (">8", 9, 1 << 30))


def wait_by_size(done: Iterable[TraceJob], waited: Mapping[str, float]) -> dict[str, dict[str, float | int]]:
    """Return, per size class of total GPUs, the jobs, their mean and their longest wait (CPU-only jobs in "1")."""
    classes: dict[str, list[float]] = {name: [] for name, _, _ in SIZE_CLASSES}
    for job in done:
        gpus = max(1, job.total_gpus)
        name = next(n for n, low, high in SIZE_CLASSES if low <= gpus <= high)
        classes[name].append(waited.get(job.id, 0.0))
    return {
        name: {
            "jobs": len(values),
            "mean_s": round(sum(values) / len(values), 1) if values else 0.0,
            "max_s": round(max(values, default=0.0), 1),
        }
        for name, values in classes.items()
    }
