"""Run-time predictions learned from history, by the product's rule (`jobs.services.predictions`).

The predictor sees only jobs that completed (succeeded), with the run time
each needed; a job killed at its limit is left out, since its run time is
only known to exceed the limit. Similar work is the same project and GPU
shape (GPUs per replica, replicas), then, most specific first: the same
image (Philly: job type; traces have no owner, so the product's "same owner
and image" and "same image" are one group here), then any image. The group
used is the most specific holding at least `min_runs` runs, failing that the
most specific holding any; the prediction is the median of its latest
`recent` runs (one run that crashed early or hung moves it by one place).
No history, no prediction. Each completion costs one sort of at most
`recent` values; a prediction is two dictionary look-ups.
"""

from __future__ import annotations

from collections import deque
from statistics import median

from jobs.scheduler.simulator.traces import TraceJob

Key = tuple[str | int, ...]


def similar_keys(job: TraceJob) -> tuple[Key, Key]:
    """Return the job's groups, most specific first: (project, shape, image), then (project, shape)."""
    shape = (job.project_name, job.gpus, job.replicas)
    return (*shape, job.image), shape


class RuntimePredictor:
    """The median run time of the latest `recent` similar completed jobs, as the product predicts."""

    def __init__(self, recent: int = 20, min_runs: int = 3) -> None:
        self.recent = recent
        self.min_runs = min_runs
        self._runs: dict[Key, deque[float]] = {}
        self._median: dict[Key, float] = {}

    def observe(self, job: TraceJob, run_s: float) -> None:
        """Learn from a completed job that ran `run_s` seconds in all."""
        for key in similar_keys(job):
            runs = self._runs.setdefault(key, deque(maxlen=self.recent))
            runs.append(run_s)
            self._median[key] = median(runs)

    def predict(self, job: TraceJob) -> float | None:
        """Return the predicted run time of `job`, or None without similar history."""
        groups = [key for key in similar_keys(job) if key in self._runs]
        if not groups:
            return None
        enough = [key for key in groups if len(self._runs[key]) >= self.min_runs]
        return self._median[(enough or groups)[0]]

    def describe(self) -> dict[str, object]:
        """Return the predictor as the run's JSON states it."""
        return {
            "learns_from": "completed jobs only (not those killed at their limit), at completion",
            "similar": ["project + GPU shape + image", "project + GPU shape"],
            "estimate": f"median of the latest {self.recent} runs of the most specific group with at least "
            f"{self.min_runs} (else any)",
        }
