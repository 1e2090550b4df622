"""Free capacity of one pool during a pass, indexed so that best fit is a few list lookups.

For each GPU model the pool's nodes sit in buckets by how many GPUs of that
model they have free; a second set of buckets counts all free GPUs of a node
(for CPU-only work). Buckets are sorted lists of node numbers, so the first
node that fits is also the first by name: determinism without sorting in the
hot path. Everything is mutable and lives only for one pass.

Bin-packing avoids stranding GPUs (the fragmentation idea of FGD, Weng et
al., ATC '23, reduced to what is cheap to keep up to date). A free GPU is
*stranded* when its node has too little CPU or memory left to go with it:
less per free GPU than the pool's leanest node has per GPU, so work sized
for that node could not use it. Best fit alone ignores this: it sends a
CPU-hungry single-GPU pod to the node with the fewest free GPUs even when
that leaves the node's other GPU without CPU. A placement therefore goes
where it strands the fewest GPUs (or frees the most stranded ones), then
where it leaves the fewest GPUs free (best fit, which also keeps whole
nodes whole for large gangs), then to the first node by name. Stranding
nodes are few by construction, so they are kept in a set and scored
first; the others are scanned in best-fit order and the scan stops at the
first free-count level where a placement strands nothing.

A search may be given `excluded` node numbers (the nodes that cannot mount a
workload's volumes, `storage.Mounts`): they are skipped like nodes without
the CPU or memory, so the empty set of the common case costs a set lookup.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from jobs.scheduler.core.fabric import Fabrics
from jobs.scheduler.core.model import Node, PlacementPolicy, Workload
from jobs.scheduler.core.storage import Mounts

# A bin-packing candidate, smaller is better: (GPUs it strands, GPUs it leaves free, node number, model).
Score = tuple[int, int, int, str]

NO_NODES: frozenset[int] = frozenset()


class NodeState:
    """One schedulable node's free CPU, memory and GPUs (uuids by model, lowest index first)."""

    __slots__ = ("cpu", "free", "free_count", "memory", "models", "name", "number", "stranded")

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
        self.free_count = sum(map(len, free.values()))
        self.stranded = 0  # free GPUs without the CPU or memory to use them (set by the pool)


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
        bucket = self.buckets[count]
        if not bucket or bucket[-1] < node:
            bucket.append(node)  # nodes are first added in order: no search
        else:
            insort(bucket, node)

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
        per_gpu: list[tuple[int, int]] = []  # each GPU node's CPU and memory per healthy GPU
        ordered = sorted(nodes, key=lambda n: n.name)
        for node in ordered:
            self._add_node(node, allocated, per_gpu)
        self.mounts = Mounts(ordered)
        self.fabrics = Fabrics(ordered)
        # The least CPU and memory a node of the pool has per GPU: less than this left per free GPU strands it.
        self.cpu_per_gpu = min((cpu for cpu, _ in per_gpu), default=0)
        self.memory_per_gpu = min((memory for _, memory in per_gpu), default=0)
        self.stranding: set[int] = set()  # numbers of nodes with stranded GPUs
        for state in self.nodes:
            if state.free_count:
                self._restrand(state)
        self.models: tuple[str, ...] = tuple(sorted(self.capacity_by_model))
        # Free capacity when the pass began: tells "taken by work ahead of you" from "the pool is full".
        self.initial_free_by_model = dict(self.free_by_model)
        self.initial_largest_by_model = {model: self.by_model[model].largest() for model in self.models}

    def _add_node(self, node: Node, allocated: set[str], per_gpu: list[tuple[int, int]]) -> None:
        number = len(self.nodes)
        self.number_of[node.name] = number
        free: dict[str, list[tuple[int, str]]] = {}
        healthy: dict[str, int] = {}
        gpu_of = self.gpu_of
        for gpu in node.gpus:  # every GPU of the pool, every pass: kept lean
            if not gpu.healthy:
                continue
            model, uuid = gpu.model, gpu.uuid
            gpu_of[uuid] = (gpu.index, model)
            healthy[model] = healthy.get(model, 0) + 1
            if gpu.free and uuid not in allocated:
                if model in free:
                    free[model].append((gpu.index, uuid))
                else:
                    free[model] = [(gpu.index, uuid)]
        if healthy:
            total = sum(healthy.values())
            per_gpu.append((node.cpu_milli // total, node.memory_mib // total))
        for model, count in healthy.items():
            self.capacity_by_model[model] = self.capacity_by_model.get(model, 0) + count
            self.largest_node_by_model[model] = max(self.largest_node_by_model.get(model, 0), count)
            if model not in self.by_model:
                self.by_model[model] = _Buckets()
        for model, gpus in free.items():
            gpus.sort()
            self.by_model[model].add(len(gpus), number)
            self.free_by_model[model] = self.free_by_model.get(model, 0) + len(gpus)
        for model in healthy:
            if model not in free:
                self.by_model[model].add(0, number)
        state = NodeState(number, node.name, node.cpu_free_milli, node.memory_free_mib, free, frozenset(healthy))
        self.nodes.append(state)
        self.by_total.add(state.free_count, number)

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

    def find(
        self, models: tuple[str, ...], gpus: int, cpu: int, memory: int, excluded: frozenset[int] = NO_NODES
    ) -> tuple[int, str] | None:
        """Return (node number, model) of the best node but `excluded` for one replica, or None when none fits.

        Bin-packing takes the node where the replica strands the fewest GPUs,
        then leaves the fewest GPUs of its model free (for CPU-only work: the
        fewest GPUs free overall); spread takes the node with the most free
        GPUs. Ties go to the first node by name.
        """
        if self.spread:
            return self._find_spread(models, gpus, cpu, memory, excluded)
        best = self._best_stranding(models, gpus, cpu, memory, excluded) if self.stranding else None
        if gpus == 0:
            return self._scan([(self.by_total.buckets, "")], 0, cpu, memory, best, excluded)
        return self._scan([(self.by_model[m].buckets, m) for m in models], gpus, cpu, memory, best, excluded)

    def _best_stranding(
        self, models: tuple[str, ...], gpus: int, cpu: int, memory: int, excluded: frozenset[int]
    ) -> Score | None:
        """Return the best score among nodes that strand GPUs now (where a placement may also un-strand some)."""
        best: Score | None = None
        for number in self.stranding:
            node = self.nodes[number]
            if node.cpu < cpu or node.memory < memory or number in excluded:
                continue
            for model in models if gpus else ("",):
                left = len(node.free.get(model, ())) - gpus if gpus else node.free_count
                if left >= 0:
                    score = (self._strands(node, gpus, cpu, memory), left, number, model)
                    if best is None or score < best:
                        best = score
        return best

    def _scan(
        self,
        sources: list[tuple[list[list[int]], str]],
        gpus: int,
        cpu: int,
        memory: int,
        best: Score | None,
        excluded: frozenset[int],
    ) -> tuple[int, str] | None:
        """Scan the nodes that strand nothing yet, fewest GPUs left free first, keeping the best score.

        `sources` are (buckets by free count, model) to search. On a node that
        strands nothing, a placement strands zero GPUs or more, so once the
        best score strands none (or frees stranded ones), counts leaving more
        GPUs free cannot beat it: the scan usually ends at the first count.
        """
        nodes, stranding = self.nodes, self.stranding
        # The best so far as plain locals: this loop runs for every replica placed.
        found = best is not None
        b_strands, b_left, b_number, b_model = best if best is not None else (0, 0, 0, "")
        for count in range(gpus, max((len(buckets) for buckets, _ in sources), default=0)):
            left = count - gpus
            if found and (b_strands < 0 or (b_strands == 0 and b_left < left)):
                break
            for buckets, model in sources:
                if count >= len(buckets):
                    continue
                for number in buckets[count]:
                    if found and b_strands <= 0 and (b_strands < 0 or b_left < left or b_number <= number):
                        break  # nothing further in this bucket scores better
                    node = nodes[number]
                    if node.cpu < cpu or node.memory < memory or number in stranding or number in excluded:
                        continue
                    # The node strands nothing now, so what it would strand is the whole difference.
                    strands = self._stranded(node.free_count - gpus, node.cpu - cpu, node.memory - memory)
                    if not found or (strands, left, number, model) < (b_strands, b_left, b_number, b_model):
                        found, b_strands, b_left, b_number, b_model = True, strands, left, number, model
        return (b_number, b_model) if found else None

    def _strands(self, node: NodeState, gpus: int, cpu: int, memory: int) -> int:
        """Return how many more GPUs the node strands once the replica takes `gpus`, `cpu` and `memory` there."""
        return self._stranded(node.free_count - gpus, node.cpu - cpu, node.memory - memory) - node.stranded

    def _stranded(self, gpus: int, cpu: int, memory: int) -> int:
        if not gpus:
            return 0
        slots = gpus
        if self.cpu_per_gpu:
            slots = min(slots, max(0, cpu) // self.cpu_per_gpu)
        if self.memory_per_gpu:
            slots = min(slots, max(0, memory) // self.memory_per_gpu)
        return gpus - slots

    def _restrand(self, node: NodeState) -> None:
        stranded = self._stranded(node.free_count, node.cpu, node.memory)
        if stranded == node.stranded:
            return  # the common case after every take and give: nothing to move
        node.stranded = stranded
        if stranded:
            self.stranding.add(node.number)
        else:
            self.stranding.discard(node.number)

    def _find_spread(
        self, models: tuple[str, ...], gpus: int, cpu: int, memory: int, excluded: frozenset[int]
    ) -> tuple[int, str] | None:
        if gpus == 0:
            return self._find_cpu_only(cpu, memory, excluded)
        nodes = self.nodes
        best: tuple[int, str] | None = None
        counts = range(gpus, max((len(self.by_model[m].buckets) for m in models), default=0))
        for count in reversed(counts):
            for model in models:
                buckets = self.by_model[model].buckets
                if count >= len(buckets):
                    continue
                for number in buckets[count]:
                    if best is not None and number >= best[0]:
                        break
                    node = nodes[number]
                    if node.cpu >= cpu and node.memory >= memory and number not in excluded:
                        best = (number, model)
                        break
            if best is not None:
                return best
        return None

    def _find_cpu_only(self, cpu: int, memory: int, excluded: frozenset[int]) -> tuple[int, str] | None:
        # Spread: CPU-only work goes where the most GPUs are free.
        buckets = self.by_total.buckets
        for count in reversed(range(len(buckets))):
            for number in buckets[count]:
                node = self.nodes[number]
                if node.cpu >= cpu and node.memory >= memory and number not in excluded:
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
        self._restrand(node)
        return Take(number, model, taken, cpu, memory)

    def occupy(self, take: Take) -> None:
        """Take exactly the GPUs, CPU and memory `take` names again (they must be free)."""
        node = self.nodes[take.node]
        if take.gpus:
            wanted = set(take.gpus)
            self._set_free(node, take.model, [gpu for gpu in node.free[take.model] if gpu not in wanted])
        node.cpu -= take.cpu
        node.memory -= take.memory
        self._restrand(node)

    def give(self, take: Take) -> None:
        """Give back what `take` took."""
        node = self.nodes[take.node]
        if take.gpus:
            self._set_free(node, take.model, sorted([*node.free.get(take.model, []), *take.gpus]))
        node.cpu += take.cpu
        node.memory += take.memory
        self._restrand(node)

    def _set_free(self, node: NodeState, model: str, free: list[tuple[int, str]]) -> None:
        old = len(node.free.get(model, ()))
        old_total = node.free_count
        node.free[model] = free
        node.free_count = old_total - old + len(free)
        self.by_model[model].move(node.number, old, len(free))
        self.free_by_model[model] = self.free_by_model.get(model, 0) + len(free) - old
        self.by_total.move(node.number, old_total, node.free_count)

    def place_gang(
        self,
        models: tuple[str, ...],
        gpus: int,
        replicas: int,
        cpu: int,
        memory: int,
        excluded: frozenset[int] = NO_NODES,
    ) -> list[Take] | None:
        """Place every replica or none, never on `excluded` nodes: return what was taken, or None (nothing taken).

        The replicas go where the pool's best fit puts them when those nodes
        may share a gang (`fabric`); otherwise the search is repeated inside
        each group of nodes that may, then on each single node with room for
        the whole gang. Identical replicas on independent nodes make the
        greedy search exact: when it finds no room in the whole pool, none of
        its parts has any, so a failure costs one search.
        """
        taken = self._place_each(models, gpus, replicas, cpu, memory, excluded)
        fabrics = self.fabrics
        # Checked in this order so that the common case (a pool whose nodes need no swarm) builds no set.
        if taken is None or replicas == 1 or not fabrics.restricted or fabrics.may_share({t.node for t in taken}):
            return taken
        self._give_back(taken)
        for outside, managers in fabrics.swarms(excluded):
            taken = self._place_in_swarm(models, gpus, replicas, cpu, memory, outside, managers)
            if taken is not None:
                return taken
        outside_unbound = fabrics.unbound(excluded)
        if outside_unbound is not None:
            taken = self._place_each(models, gpus, replicas, cpu, memory, outside_unbound)
            if taken is not None:
                return taken
        for number in self._holding_all(models, gpus, replicas, cpu, memory, excluded):
            taken = self._place_each(models, gpus, replicas, cpu, memory, fabrics.alone(number, excluded))
            if taken is not None:
                return taken
        return None

    def _place_in_swarm(
        self,
        models: tuple[str, ...],
        gpus: int,
        replicas: int,
        cpu: int,
        memory: int,
        outside: frozenset[int],
        managers: frozenset[int],
    ) -> list[Take] | None:
        """Place the gang on nodes of one swarm (all but `outside`), one replica on one of its `managers`."""
        taken = self._place_each(models, gpus, replicas, cpu, memory, outside)
        if taken is None or self.fabrics.may_share({take.node for take in taken}):
            return taken
        self._give_back(taken)
        # The best fit spread it over workers alone: the first replica goes to a manager (best fit first).
        for manager in self._holding_all(models, gpus, 1, cpu, memory, self.fabrics.outside(managers)):
            first = self._place_each(models, gpus, 1, cpu, memory, self.fabrics.alone(manager, outside))
            rest = self._place_each(models, gpus, replicas - 1, cpu, memory, outside) if first else None
            if first and rest is not None:
                return first + rest
            self._give_back(first or [])
        return None

    def takes_of(self, workload: Workload) -> tuple[Take, ...]:
        """Return what a running workload holds here, as takes that `give` frees and `occupy` takes again.

        Replicas on nodes that take no new work are left out: freeing them
        frees nothing usable. A replica's CPU and memory are counted once.
        """
        takes: list[Take] = []
        for replica in workload.allocation:
            number = self.number_of.get(replica.node)
            if number is None:
                continue
            by_model: dict[str, list[tuple[int, str]]] = {}
            for uuid in replica.gpu_uuids:
                if uuid in self.gpu_of:
                    index, model = self.gpu_of[uuid]
                    by_model.setdefault(model, []).append((index, uuid))
            cpu, memory = workload.cpu_milli, workload.memory_mib
            for model, gpus in sorted(by_model.items()) or [("", [])]:
                takes.append(Take(number, model, tuple(sorted(gpus)), cpu, memory))
                cpu = memory = 0
        return tuple(takes)

    def fits_unshared(self, workload: Workload, models: tuple[str, ...]) -> bool:
        """Return whether the gang would fit free capacity now if its nodes did not have to share a fabric."""
        excluded = self.mounts.excluded(workload.storage)
        taken = self._place_each(
            models, workload.gpus, workload.replicas, workload.cpu_milli, workload.memory_mib, excluded
        )
        self._give_back(taken or [])
        return taken is not None

    def _place_each(
        self, models: tuple[str, ...], gpus: int, replicas: int, cpu: int, memory: int, excluded: frozenset[int]
    ) -> list[Take] | None:
        taken: list[Take] = []
        for _ in range(replicas):
            found = self.find(models, gpus, cpu, memory, excluded)
            if found is None:
                self._give_back(taken)
                return None
            taken.append(self.take(found[0], found[1], gpus, cpu, memory))
        return taken

    def _give_back(self, taken: list[Take]) -> None:
        for take in reversed(taken):
            self.give(take)

    def _holding_all(
        self, models: tuple[str, ...], gpus: int, replicas: int, cpu: int, memory: int, excluded: frozenset[int]
    ) -> list[int]:
        """Return the nodes but `excluded` with room for every replica at once, the fewest free GPUs first."""
        room = [
            (node.free_count, node.number)
            for node in self.nodes
            if node.number not in excluded
            and node.cpu >= cpu * replicas
            and node.memory >= memory * replicas
            and (not gpus or sum(len(node.free.get(model, ())) // gpus for model in models) >= replicas)
        ]
        return [number for _, number in sorted(room)]
