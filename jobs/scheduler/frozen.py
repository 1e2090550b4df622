"""Run the scheduling core with the garbage collector kept off the snapshot: how the shell, the simulator and
the benchmarks run a pass.

A snapshot of a large cluster is some hundred thousand objects, all alive
for the whole pass, and a pass allocates as many again. CPython's full
collections, which the pass's own allocations trigger, walked the whole
snapshot each time: a quarter of an incremental pass on the Alibaba
cluster (bench/scheduler_pass.py: p95 58 ms with it, 38 ms without).
Freezing moves every object alive before the pass out of the collector's
sight (`gc.freeze`) until it ends; what the pass allocates is collected as
usual. The decisions are the core's, unchanged.
"""

from __future__ import annotations

import gc

from jobs.scheduler.core import Decisions, Snapshot
from jobs.scheduler.core import schedule as core_schedule


def schedule(snapshot: Snapshot) -> Decisions:
    """Return `jobs.scheduler.core.schedule(snapshot)`, computed with the objects alive now frozen.

    Leaves the collector alone when something else in the process already
    froze objects (`gc.get_freeze_count()`): unfreezing would undo that.
    """
    if gc.get_freeze_count():
        return core_schedule(snapshot)
    gc.freeze()
    try:
        return core_schedule(snapshot)
    finally:
        gc.unfreeze()
