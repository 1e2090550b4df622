"""Free capacity of one pool during a pass, indexed so that best fit is a few list lookups.

For each GPU model the pool's nodes sit in buckets by how many GPUs of that
model they have free; a second set of buckets counts all free GPUs of a node
(for CPU-only work). Buckets are sorted lists of node numbers, so the first
node that fits is also the first by name: determinism without sorting in the
hot path. Everything is mutable and lives only for one pass.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from jobs.scheduler.core.model import Node, PlacementPolicy


class NodeState:
    """One schedulable node's free CPU, memory and GPUs (uuids by model, lowest index first)."""

    __slots__ = ("cpu", "free", "memory", "models", "name", "number")

    def __init__(
        self,
        number: int,
        name: str,
        cpu: int,
        memory: int,
        free: dict[str, list[tuple[int, str]]],
        models: frozenset[str],
    ) -> None:
        self.number = number
        self.name = name
        self.cpu = cpu
        self.memory = memory
        self.free = free
        self.models = models  # of its healthy GPUs, free or not

    def free_total(self) -> int:
        """Return the GPUs of any model free on this node."""
        return sum(len(gpus) for gpus in self.free.values())


@dataclass(frozen=True, slots=True)
class Take:
    """GPUs, CPU and memory taken on one node for one replica; giving it back undoes it exactly."""

    node: int
    model: str
    gpus: tuple[tuple[int, str], ...]
    cpu: int
    memory: int


class _Buckets:
    """Node numbers bucketed by a free count; bucket k is sorted."""

    __slots__ = ("buckets",)

    def __init__(self) -> None:
        self.buckets: list[list[int]] = [[]]

    def add(self, count: int, node: int) -> None:
        while len(self.buckets) <= count:
            self.buckets.append([])
        insort(self.buckets[count], node)

    def move(self, node: int, old: int, new: int) -> None:
        bucket = self.buckets[old]
        del bucket[bisect_left(bucket, node)]
        self.add(new, node)

    def largest(self) -> int:
        """Return the largest non-empty bucket's count, 0 if every node is full."""
        for count in range(len(self.buckets) - 1, 0, -1):
            if self.buckets[count]:
                return count
        return 0


class PoolCapacity:
    """The free capacity of one pool, with best-fit (or spread) search and exact undo."""

    def __init__(self, name: str, policy: PlacementPolicy, nodes: Sequence[Node], allocated: set[str]) -> None:
        self.name = name
        self.spread = policy is PlacementPolicy.SPREAD
        self.nodes: list[NodeState] = []
        self.by_model: dict[str, _Buckets] = {}
        self.by_total = _Buckets()
        self.free_by_model: dict[str, int] = {}
        # What could ever fit here: healthy GPUs on schedulable nodes, per model and on the largest node.
        self.capacity_by_model: dict[str, int] = {}
        self.largest_node_by_model: dict[str, int] = {}
        # Where running work sits, to turn a victim's allocation back into what it frees.
        self.number_of: dict[str, int] = {}
        self.gpu_of: dict[str, tuple[int, str]] = {}
        for node in sorted(nodes, key=lambda n: n.name):
            self._add_node(node, allocated)
        self.models: tuple[str, ...] = tuple(sorted(self.capacity_by_model))
        # Free capacity when the pass began: tells "taken by work ahead of you" from "the pool is full".
        self.initial_free_by_model = dict(self.free_by_model)
        self.initial_largest_by_model = {model: self.by_model[model].largest() for model in self.models}

    def _add_node(self, node: Node, allocated: set[str]) -> None:
        number = len(self.nodes)
        self.number_of[node.name] = number
        free: dict[str, list[tuple[int, str]]] = {}
        healthy: dict[str, int] = {}
        for gpu in node.gpus:
            if not gpu.healthy:
                continue
            self.gpu_of[gpu.uuid] = (gpu.index, gpu.model)
            healthy[gpu.model] = healthy.get(gpu.model, 0) + 1
            if gpu.free and gpu.uuid not in allocated:
                free.setdefault(gpu.model, []).append((gpu.index, gpu.uuid))
        for model, count in healthy.items():
            self.capacity_by_model[model] = self.capacity_by_model.get(model, 0) + count
            self.largest_node_by_model[model] = max(self.largest_node_by_model.get(model, 0), count)
            self.by_model.setdefault(model, _Buckets())
        for model, gpus in free.items():
            gpus.sort()
            self.by_model[model].add(len(gpus), number)
            self.free_by_model[model] = self.free_by_model.get(model, 0) + len(gpus)
        for model in healthy:
            if model not in free:
                self.by_model[model].add(0, number)
        state = NodeState(number, node.name, node.cpu_free_milli, node.memory_free_mib, free, frozenset(healthy))
        self.nodes.append(state)
        self.by_total.add(state.free_total(), number)

    def accepted(self, models: frozenset[str]) -> tuple[str, ...]:
        """Return the pool's GPU models a workload accepts (all of them when it names none), sorted."""
        return self.models if not models else tuple(m for m in self.models if m in models)

    def free_gpus(self, models: Iterable[str]) -> int:
        """Return the free GPUs of these models in the pool."""
        return sum(self.free_by_model.get(model, 0) for model in models)

    def initially_fits(self, models: Iterable[str], gpus: int, replicas: int) -> bool:
        """Return whether the GPUs free when the pass began could have held this gang, by counts alone."""
        models = tuple(models)
        free = sum(self.initial_free_by_model.get(model, 0) for model in models)
        largest = max((self.initial_largest_by_model.get(model, 0) for model in models), default=0)
        return free >= gpus * replicas and largest >= gpus

    def largest_free(self, models: Iterable[str]) -> int:
        """Return the most GPUs of one of these models free on a single node."""
        return max((self.by_model[model].largest() for model in models), default=0)

    def find(self, models: tuple[str, ...], gpus: int, cpu: int, memory: int) -> tuple[int, str] | None:
        """Return (node number, model) of the best node for one replica, or None when no node fits.

        Best fit takes the node with the fewest free GPUs that still fit (the
        fewest free GPUs overall for CPU-only work); spread takes the most.
        Ties go to the first node by name.
        """
        if gpus == 0:
            return self._find_cpu_only(cpu, memory)
        nodes = self.nodes
        best: tuple[int, str] | None = None
        counts = range(gpus, max((len(self.by_model[m].buckets) for m in models), default=0))
        for count in reversed(counts) if self.spread else counts:
            for model in models:
                buckets = self.by_model[model].buckets
                if count >= len(buckets):
                    continue
                for number in buckets[count]:
                    if best is not None and number >= best[0]:
                        break
                    node = nodes[number]
                    if node.cpu >= cpu and node.memory >= memory:
                        best = (number, model)
                        break
            if best is not None:
                return best
        return None

    def _find_cpu_only(self, cpu: int, memory: int) -> tuple[int, str] | None:
        # CPU-only work goes where the fewest GPUs are free, to leave whole GPU nodes for GPU work.
        buckets = self.by_total.buckets
        for count in reversed(range(len(buckets))) if self.spread else range(len(buckets)):
            for number in buckets[count]:
                node = self.nodes[number]
                if node.cpu >= cpu and node.memory >= memory:
                    return (number, "")
        return None

    def take(self, number: int, model: str, gpus: int, cpu: int, memory: int) -> Take:
        """Take `gpus` GPUs of `model` (lowest index first), CPU and memory on a node; return what was taken."""
        node = self.nodes[number]
        taken: tuple[tuple[int, str], ...] = ()
        if gpus:
            free = node.free[model]
            taken = tuple(free[:gpus])
            self._set_free(node, model, free[gpus:])
        node.cpu -= cpu
        node.memory -= memory
        return Take(number, model, taken, cpu, memory)

    def occupy(self, take: Take) -> None:
        """Take exactly the GPUs, CPU and memory `take` names again (they must be free)."""
        node = self.nodes[take.node]
        if take.gpus:
            wanted = set(take.gpus)
            self._set_free(node, take.model, [gpu for gpu in node.free[take.model] if gpu not in wanted])
        node.cpu -= take.cpu
        node.memory -= take.memory

    def give(self, take: Take) -> None:
        """Give back what `take` took."""
        node = self.nodes[take.node]
        if take.gpus:
            self._set_free(node, take.model, sorted([*node.free.get(take.model, []), *take.gpus]))
        node.cpu += take.cpu
        node.memory += take.memory

    def _set_free(self, node: NodeState, model: str, free: list[tuple[int, str]]) -> None:
        old = len(node.free.get(model, ()))
        old_total = node.free_total()
        node.free[model] = free
        self.by_model[model].move(node.number, old, len(free))
        self.free_by_model[model] = self.free_by_model.get(model, 0) + len(free) - old
        self.by_total.move(node.number, old_total, old_total - old + len(free))

    def place_gang(self, models: tuple[str, ...], gpus: int, replicas: int, cpu: int, memory: int) -> list[Take] | None:
        """Place every replica or none: return what was taken, or None (with nothing taken) when one does not fit."""
        taken: list[Take] = []
        for _ in range(replicas):
            found = self.find(models, gpus, cpu, memory)
            if found is None:
                for take in reversed(taken):
                    self.give(take)
                return None
            taken.append(self.take(found[0], found[1], gpus, cpu, memory))
        return taken
