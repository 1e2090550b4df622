"""Which nodes of a pool can mount the volumes of a workload.

A workload names the storage backends of the volumes it mounts
(`Workload.storage`); it is placed only on nodes whose `Node.storage` is None
(any backend: simulated and legacy nodes) or holds every one of them. Most
workloads mount nothing and most pools have no restricted node, so the common
case is a truth test that returns the empty set; otherwise the nodes a set of
backends rules out are found once per pass and set of backends.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobs.scheduler.core.model import Node, Workload

_NONE: frozenset[int] = frozenset()


class Mounts:
    """The storage each node of one pool can mount, by node number (the pool's nodes sorted by name)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = tuple(nodes)
        self.restricted = any(node.storage is not None for node in self.nodes)
        self._excluded: dict[frozenset[str], frozenset[int]] = {}

    def excluded(self, storage: frozenset[str]) -> frozenset[int]:
        """Return the numbers of the nodes that cannot mount every backend in `storage` (none when it is empty)."""
        if not storage or not self.restricted:
            return _NONE
        found = self._excluded.get(storage)
        if found is None:
            found = self._excluded[storage] = frozenset(
                number
                for number, node in enumerate(self.nodes)
                if node.storage is not None and not storage <= node.storage
            )
        return found

    def never_holds(self, workload: Workload, models: tuple[str, ...]) -> bool:
        """Return whether the nodes that can mount the workload's volumes could never hold it, free or not.

        They cannot when there is none, or (for GPU work) when none has
        enough healthy GPUs of an accepted model for one replica, or all of
        them together too few for the gang.
        """
        excluded = self.excluded(workload.storage)
        if not excluded:
            return False
        mountable = [node for number, node in enumerate(self.nodes) if number not in excluded]
        if not mountable or not workload.gpus:
            return not mountable
        counts = [_healthy(node, models) for node in mountable]
        largest = max(max(count.values(), default=0) for count in counts)
        return largest < workload.gpus or sum(sum(count.values()) for count in counts) < workload.total_gpus

    def backends_for(self, workload: Workload, models: tuple[str, ...]) -> list[str]:
        """Return the backends mountable on nodes with enough healthy GPUs of an accepted model for one replica."""
        found: set[str] = set()
        for node in self.nodes:
            if node.storage is not None and (
                not workload.gpus or max(_healthy(node, models).values(), default=0) >= workload.gpus
            ):
                found |= node.storage
        return sorted(found)


def _healthy(node: Node, models: tuple[str, ...]) -> dict[str, int]:
    """Return the node's healthy GPUs of each of `models` it has."""
    counts: dict[str, int] = {}
    for gpu in node.gpus:
        if gpu.healthy and gpu.model in models:
            counts[gpu.model] = counts.get(gpu.model, 0) + 1
    return counts
