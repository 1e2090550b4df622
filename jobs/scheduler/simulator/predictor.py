"""Run-time predictions learned from history, as the product would make them.

The predictor sees only jobs that completed (succeeded): the run time each
needed. A job killed at its limit is left out, since its run time is only
known to exceed the limit. Similar work is the same tenant, image (Philly:
job type) and total GPUs; without such history the same tenant and total
GPUs; without that, no prediction. A prediction is the median of the last
`window` similar completions (robust to the odd outlier, and it follows a
tenant whose jobs change). Each completion costs one sort of at most
`window` values; a prediction is two dictionary look-ups.
"""

from __future__ import annotations

from collections import deque
from statistics import median

from jobs.scheduler.simulator.traces import TraceJob

Key = tuple[str, ...]


def similar_keys(job: TraceJob) -> tuple[Key, Key]:
    """Return the job's keys, most specific first: (tenant, image, total GPUs), then (tenant, total GPUs)."""
    gpus = str(job.total_gpus)
    return (job.tenant, job.image, gpus), (job.tenant, gpus)


class RuntimePredictor:
    """The median run time of the last `window` similar completed jobs."""

    def __init__(self, window: int = 20) -> None:
        self.window = window
        self._recent: dict[Key, deque[float]] = {}
        self._median: dict[Key, float] = {}

    def observe(self, job: TraceJob, run_s: float) -> None:
        """Learn from a completed job that ran `run_s` seconds in all."""
        for key in similar_keys(job):
            recent = self._recent.setdefault(key, deque(maxlen=self.window))
            recent.append(run_s)
            self._median[key] = median(recent)

    def predict(self, job: TraceJob) -> float | None:
        """Return the predicted run time of `job`, or None without similar history."""
        specific, general = similar_keys(job)
        found = self._median.get(specific)
        return found if found is not None else self._median.get(general)

    def describe(self) -> dict[str, object]:
        """Return the predictor as the run's JSON states it."""
        return {
            "learns_from": "completed jobs only (not those killed at their limit), at completion",
            "similar": ["tenant + image + total GPUs", "tenant + total GPUs"],
            "estimate": f"median of the last {self.window} similar completions",
        }
