"""Time in a pass: when running work frees its GPUs, reservations for blocked work, and start-time estimates.

Two clocks, for two uses:
- **by limit** (`end_by_limit`): when a workload is sure to have ended,
  since it is killed at its limit. Reservations rest on it, as Slurm's
  backfill does on time limits: work that backfills must end by its limit
  before the reservation starts, so a reservation is never delayed.
- **planned** (`planned_end`): when it is expected to end, from its predicted
  run time capped by its limit (`model.planned_run_s`). Estimates rest on it:
  the most likely time, not the latest.
A workload with neither a limit nor a prediction has no known end (infinity).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from jobs.scheduler.core.capacity import NO_NODES, PoolCapacity, Take
from jobs.scheduler.core.model import Workload, planned_run_s

# A reservation search tries a placement at most this often before it gives up for the pass: bounds a pass's
# cost on a large pool (each try is a best-fit search).
MAX_RESERVATION_TRIES = 64


def end_by_limit(workload: Workload) -> float:
    """Return when a running workload is killed at the latest (its start + its limit); infinity without a limit."""
    if workload.started_at is None or workload.limit_s is None:
        return math.inf
    return workload.started_at + workload.limit_s


def planned_end(workload: Workload, now: float) -> float:
    """Return when a running workload is expected to end; infinity when nothing says.

    A workload that already ran past its predicted end is expected to run
    half its planned time again, never past its limit.
    """
    run = planned_run_s(workload)
    if workload.started_at is None or run is None:
        return math.inf
    end = workload.started_at + run
    if end > now:
        return end
    return min(end_by_limit(workload), now + max(run / 2, 60.0))


@dataclass(frozen=True, slots=True)
class Hold:
    """A reservation in the making: when it starts and the takes it will need then."""

    start_at: float
    takes: tuple[Take, ...]


def find_reservation(
    capacity: PoolCapacity,
    claimant: Workload,
    models: tuple[str, ...],
    running: Sequence[tuple[Workload, tuple[Take, ...]]],
    excluded: frozenset[int] = NO_NODES,
) -> Hold | None:
    """Return the earliest start by running work's limits at which `claimant` fits, and where; None if never.

    Running work is freed in the order of its limit-bound ends, all that
    ends at one instant together, until the gang fits. `capacity` is left
    exactly as it was.
    """
    ordered = sorted(((end_by_limit(w), i) for i, (w, _) in enumerate(running)), key=lambda item: item)
    released: list[Take] = []
    free = capacity.free_gpus(models)
    need, tries, found = claimant.total_gpus, 0, None
    try:
        for position, (end, index) in enumerate(ordered):
            if math.isinf(end):
                break
            for take in running[index][1]:
                capacity.give(take)
                released.append(take)
                free += len(take.gpus) if take.model in models else 0
            if free < need or (position + 1 < len(ordered) and ordered[position + 1][0] == end):
                continue  # too few GPUs yet, or more ends at the same instant
            if claimant.gpus and capacity.largest_free(models) < claimant.gpus:
                continue
            tries += 1
            takes = capacity.place_gang(
                models, claimant.gpus, claimant.replicas, claimant.cpu_milli, claimant.memory_mib, excluded
            )
            if takes is not None:
                for take in reversed(takes):
                    capacity.give(take)
                found = Hold(end, tuple(takes))
                break
            if tries >= MAX_RESERVATION_TRIES:
                break
    finally:
        for take in reversed(released):
            capacity.occupy(take)
    return found


def free_now(capacity: PoolCapacity, hold: Hold) -> list[Take]:
    """Return the parts of a reservation's takes that are free now (GPUs only): what holding it keeps from others."""
    held = []
    for take in hold.takes:
        node = capacity.nodes[take.node]
        free = set(node.free.get(take.model, ()))
        gpus = tuple(gpu for gpu in take.gpus if gpu in free)
        if gpus:
            held.append(Take(take.node, take.model, gpus, 0, 0))
    return held


def earliest_start(now: float, free: int, need: int, ends: Iterable[tuple[float, int]]) -> float:
    """Return when `need` GPUs are free by count, given `free` now and (end, GPUs) of running work; inf if never."""
    if free >= need:
        return now
    for end, gpus in sorted(ends):
        if math.isinf(end):
            return math.inf
        free += gpus
        if free >= need:
            return max(now, end)
    return math.inf


class Estimator:
    """Start-time estimates for a pool's waiting work, in queue order, by GPU count.

    Running work frees its GPUs at its planned end; each waiting workload
    starts, in queue order, as soon as enough GPUs are free, and holds them
    for its planned run time. Work that arrives later, preemption and
    fragmentation are not foreseen: the basis sentence says so.
    """

    def __init__(self, now: float, free: int, capacity: int, running: Iterable[Workload]) -> None:
        self.now = now
        self.free = free
        self.capacity = capacity
        self.clock = now
        self.ends: list[tuple[float, int]] = [(planned_end(w, now), w.total_gpus) for w in running]
        heapq.heapify(self.ends)

    def next_start(self, workload: Workload) -> float:
        """Return when `workload` is expected to start after the work estimated before it; inf if never."""
        need = workload.total_gpus
        if need > self.capacity:
            return math.inf
        while self.free < need and self.ends:
            end, gpus = heapq.heappop(self.ends)
            if math.isinf(end):
                heapq.heappush(self.ends, (end, gpus))
                return math.inf
            self.clock = max(self.clock, end)
            self.free += gpus
        if self.free < need:
            return math.inf
        self.free -= need
        run = planned_run_s(workload)
        heapq.heappush(self.ends, (self.clock + run if run is not None else math.inf, need))
        return self.clock
