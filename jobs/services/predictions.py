"""Run-time predictions learned from history: how long a batch job will run, from similar jobs that finished.

The rule. Among the latest HISTORY succeeded jobs of the project with the
same GPU shape (GPUs per replica and replicas), take the most specific group
holding at least MIN_RUNS of them:

1. the same owner and image,
2. the same image (any owner),
3. any image (the project and the shape alone);

failing that, the most specific group holding any. The prediction is the
median run time of that group's latest RECENT runs: a median, because one
run that crashed early or hung for a day moves it by at most one place.
No history, no prediction (the scheduler plans with the time limit alone).

Only succeeded runs count: a run killed by its time limit says only that it
needed at least that long (a censored figure), and one that failed says
nothing of a whole run. A run time (`Workload.run_seconds`, written when a
job ends: `finished_fields`) is its last attempt's plus what checkpoints
kept from earlier ones (`attained_seconds`), so a preempted job's restarts
do not count twice. Notebooks are never predicted: they run as long as
their owner works.

Cost: one query per distinct (project, shape) asked about, on the partial
index `workload_finished_runs`; a submission asks once for all its items.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Workload

HISTORY = 200  # succeeded runs read per (project, shape), newest first
RECENT = 20  # runs the median is taken of
MIN_RUNS = 3  # runs a group needs before a broader one with more is passed over

# (owner id, image, run seconds) of one finished run.
Run = tuple[int, str, float]


@dataclass(frozen=True, slots=True)
class WorkKey:
    """What makes two jobs similar: project, owner, image and GPU shape."""

    project_id: int
    owner_id: int
    image: str
    gpus_per_replica: int
    replicas: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """Return (project id, GPUs per replica, replicas): the history a prediction reads."""
        return self.project_id, self.gpus_per_replica, self.replicas


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted run time in whole seconds, and the sentence saying what it rests on."""

    seconds: int
    basis: str


# The groups, most specific first: what they share with the job, and who belongs.
_GROUPS: tuple[tuple[str, Callable[[WorkKey, Run], bool]], ...] = (
    ("the same owner, image and GPU shape", lambda key, run: run[0] == key.owner_id and run[1] == key.image),
    ("the same image and GPU shape in this project", lambda key, run: run[1] == key.image),
    ("the same GPU shape in this project", lambda key, run: True),
)


def predict_runtimes(keys: Iterable[WorkKey]) -> dict[WorkKey, Prediction]:
    """Return the predicted run time of each of `keys` that has history (see the module's rule); others are left out.

    One query per distinct (project, shape) among `keys`; reads across
    tenants (the keys name projects the caller already resolved).
    """
    wanted = set(keys)
    history = {shape: _history(*shape) for shape in {key.shape for key in wanted}}
    found = {key: _predict(key, history[key.shape]) for key in wanted}
    return {key: prediction for key, prediction in found.items() if prediction is not None}


def _history(project_id: int, gpus_per_replica: int, replicas: int) -> list[Run]:
    runs = Workload.all_tenants.filter(
        project_id=project_id,
        gpus_per_replica=gpus_per_replica,
        replicas=replicas,
        state=WorkloadState.SUCCEEDED,
        run_seconds__isnull=False,
        kind=WorkloadKind.JOB,
    ).order_by("-finished_at", "-id")
    rows = runs.values_list("owner_id", "image", "run_seconds")[:HISTORY]
    return [(owner, image, seconds) for owner, image, seconds in rows if seconds is not None]


def _predict(key: WorkKey, runs: list[Run]) -> Prediction | None:
    groups = [(what, [run[2] for run in runs if belongs(key, run)][:RECENT]) for what, belongs in _GROUPS]
    chosen = next(((what, times) for what, times in groups if len(times) >= MIN_RUNS), None)
    chosen = chosen or next(((what, times) for what, times in groups if times), None)
    if chosen is None:
        return None
    what, times = chosen
    runs_word = "run" if len(times) == 1 else "runs"
    return Prediction(
        round(statistics.median(times)), f"Median of the last {len(times)} succeeded {runs_word} of {what}."
    )


def submission_fields(keys: Iterable[WorkKey]) -> Mapping[WorkKey, dict[str, Any]]:
    """Return the prediction fields (`predicted_runtime_seconds`, `prediction_basis`) for each of `keys` with
    history; one query per distinct (project, shape)."""
    return {
        key: {"predicted_runtime_seconds": found.seconds, "prediction_basis": found.basis}
        for key, found in predict_runtimes(keys).items()
    }


def finished_fields(row: Mapping[str, Any], to_state: str, now: datetime) -> dict[str, Any]:
    """Return the fields a job ending in `to_state` at `now` records: its run time and, when it succeeded with a
    prediction, the prediction's relative error; {} for a notebook or a job that never started.

    `row` holds the workload's `kind`, `started_at`, `scheduled_at`, `attained_seconds` and
    `predicted_runtime_seconds` as they were before it ended.
    """
    started = row["started_at"] or row["scheduled_at"]
    if row["kind"] != WorkloadKind.JOB or started is None:
        return {}
    run = row["attained_seconds"] + max(0.0, (now - started).total_seconds())
    fields: dict[str, Any] = {"run_seconds": run}
    predicted = row["predicted_runtime_seconds"]
    if to_state == WorkloadState.SUCCEEDED and predicted:
        fields["prediction_error"] = (run - predicted) / predicted
    return fields


def predict_waiting_like(*, project_id: int, gpus_per_replica: int, replicas: int) -> int:
    """Give the pending jobs of this project and shape that have no prediction one, now that a run of their
    shape succeeded; return how many got one.

    Two queries whatever their number (their keys, the history), and one update per key that found one.
    """
    waiting = Workload.all_tenants.filter(
        project_id=project_id,
        gpus_per_replica=gpus_per_replica,
        replicas=replicas,
        state=WorkloadState.PENDING,
        kind=WorkloadKind.JOB,
        predicted_runtime_seconds__isnull=True,
    )
    keys = {
        WorkKey(project_id, owner_id, image, gpus_per_replica, replicas)
        for owner_id, image in waiting.values_list("owner_id", "image").distinct()
    }
    return sum(
        waiting.filter(owner_id=key.owner_id, image=key.image).update(**fields)
        for key, fields in submission_fields(keys).items()
    )
