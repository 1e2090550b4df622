"""Who holds a node's GPUs: a registry the apps that allocate GPUs plug into.

The inventory app cannot import the apps above it (the jobs app's
allocations point at GPUs, not the other way round), yet a draining node may
reach maintenance only when nothing holds its GPUs. So each app that places
work on GPUs registers a counter here at start-up (in its AppConfig.ready);
the rule holds as soon as such an app exists.
"""

from __future__ import annotations

from collections.abc import Callable

GpuHoldCounter = Callable[[list[int]], dict[int, int]]
"""Given node ids, return {node id: number of active holds on that node's GPUs} (absent means 0)."""

_counters: dict[str, GpuHoldCounter] = {}


def register_gpu_holder(name: str, counter: GpuHoldCounter) -> None:
    """Register `counter` under `name`; registering the same name again replaces it."""
    _counters[name] = counter


def unregister_gpu_holder(name: str) -> None:
    """Forget the counter registered under `name` (tests use it to clean up)."""
    _counters.pop(name, None)


def holds_on_nodes(node_ids: list[int]) -> dict[int, int]:
    """Return {node id: active holds summed over every registered counter} for `node_ids`."""
    totals: dict[int, int] = {}
    for counter in _counters.values():
        for node_id, count in counter(node_ids).items():
            totals[node_id] = totals.get(node_id, 0) + count
    return totals
