"""Making room by preemption: reclaiming guarantees from borrowers, and priority inside a project.

Who may lose work, and in which order, is `victims.py`. Here: for each
replica of the claimant, the node where making room frees the fewest GPUs is
chosen (only nodes that can mount the claimant's volumes); of nodes that cost
as much, the first by name, or, once some running workload of the pool has
checkpointed (and `SchedulerConfig.checkpoint_aware` is on), the one whose
victims lose the least work (`model.lost_work`). If that does not work out
(CPU, memory, a limit), victims are added in victim order until the claimant
fits. Then each chosen victim is given back its place, largest first (of
victims as large, the one that would lose the most work first, when
checkpoints count), whenever the claimant still fits without it: a minimal
set (no single victim can be spared), not always the global minimum. Each
`Preemption` carries the victim's lost work at `now`.

A preemption must cost less than it saves: the victims' cost is the work
they lose plus the restart overhead they pay again (GPU-seconds); the
saving is the claimant's GPUs times how long it would wait otherwise, until
running work frees enough GPUs at its planned ends (`timeline`). When the
cost is higher, nobody is preempted and the claimant waits: the borrowers
are about to give the GPUs back anyway.

Preemption is rare and a loaded cluster runs thousands of workloads, so
nothing here is built before a pass first needs it, and owners that cannot
lose work are ruled out before any of their workloads is looked at.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from jobs.scheduler.core.capacity import NO_NODES, PoolCapacity, Take
from jobs.scheduler.core.model import Preemption, Reason, Workload, last_saved_at, lost_work
from jobs.scheduler.core.state import PassState
from jobs.scheduler.core.timeline import planned_end
from jobs.scheduler.core.victims import (
    newest_first,
    owner_above_fair_share,
    preemption_reason,
    victim_order,
    within_limits,
)

Chosen = list[tuple["Victim", Reason]]


@dataclass(frozen=True, slots=True)
class Victim:
    """A running workload that could be preempted, and what stopping it frees in its pool."""

    workload: Workload
    takes: tuple[Take, ...]


class Reclaimer:
    """Preemption in one pool for one pass: its running workloads, indexed by node on first use."""

    def __init__(self, state: PassState, capacity: PoolCapacity, running: list[Workload]) -> None:
        self.state = state
        self.capacity = capacity
        self.all_running = running
        self._ends: list[tuple[float, int, str]] | None = None
        self.order = victim_order if state.config.checkpoint_aware else newest_first
        oldest = state.now - state.config.min_runtime_s
        # Too young to preempt now stays too young for the whole pass.
        self.running = [w for w in running if w.started_at is not None and w.started_at <= oldest]
        # Per owner (tenant, project): its lowest running priority and one of its workloads.
        self.owners: dict[tuple[str, str], tuple[int, Workload]] = {}
        for workload in self.running:
            key = (workload.tenant, workload.project)
            if key not in self.owners or workload.priority < self.owners[key][0]:
                self.owners[key] = (workload.priority, workload)
        # Whether victims' lost work breaks ties between nodes: checkpoint-aware, and some workload has checkpointed.
        # Without checkpoints lost work only restates newest first, and the first cheapest node is taken as before.
        self.weigh_lost = state.config.checkpoint_aware and any(last_saved_at(w) != w.started_at for w in self.running)
        self._ordered: list[Workload] | None = None
        self._on_node: dict[str, list[Workload]] | None = None
        self._sorted_nodes: set[str] = set()
        self._victims: dict[str, Victim] = {}
        self.losing: set[tuple[str, str]] = set()
        self.excluded = NO_NODES  # nodes that cannot mount the current claimant's volumes

    @property
    def ordered(self) -> list[Workload]:
        """Return every preemptible-by-age workload of the pool in victim order."""
        if self._ordered is None:
            self._ordered = sorted(self.running, key=self.order)
        return self._ordered

    def on_node(self, name: str) -> list[Workload]:
        """Return the workloads holding something on node `name`, in victim order."""
        if self._on_node is None:
            # Thousands of workloads, a few per node, and a claimant looks at a few dozen nodes: each node's
            # list is put in victim order when first asked for, not the whole pool up front.
            on_node: dict[str, list[Workload]] = defaultdict(list)
            for workload in self.running:
                allocation = workload.allocation
                if len(allocation) == 1:
                    on_node[allocation[0].node].append(workload)
                    continue
                for node in dict.fromkeys(replica.node for replica in allocation):
                    on_node[node].append(workload)
            self._on_node = on_node
        workloads = self._on_node.get(name)
        if workloads is None:
            return []
        if name not in self._sorted_nodes:
            workloads.sort(key=self.order)
            self._sorted_nodes.add(name)
        return workloads

    def victim(self, workload: Workload) -> Victim:
        """Return what stopping `workload` frees (computed once per pass)."""
        victim = self._victims.get(workload.id)
        if victim is None:
            victim = self._victims[workload.id] = self._victim(workload)
        return victim

    def _victim(self, workload: Workload) -> Victim:
        return Victim(workload, self.capacity.takes_of(workload))

    def losing_owners(self, claimant: Workload) -> set[tuple[str, str]]:
        """Return the (tenant, project) owners that could lose work to `claimant` now (a superset: a cheap filter)."""
        state = self.state
        within = state.within_guarantee(claimant)
        owners = set()
        for (tenant, project), (lowest, workload) in self.owners.items():
            if tenant == claimant.tenant and project == claimant.project:
                if lowest < claimant.priority:
                    owners.add((tenant, project))
            elif within and owner_above_fair_share(state, claimant, workload):
                owners.add((tenant, project))
        return owners

    def make_room(self, claimant: Workload, models: tuple[str, ...]) -> list[Take] | None:
        """Preempt few victims so that `claimant` fits, place it and return its takes; on None nothing changed."""
        self.losing = self.losing_owners(claimant)
        if not self.losing:
            return None
        self.excluded = self.capacity.mounts.excluded(claimant.storage)
        chosen = self._node_by_node(claimant, models)
        if chosen is None:
            return None  # no node can be freed for some replica: more victims in any order would not help
        if not chosen:
            chosen = self._in_order(claimant, models)
        if not chosen:
            return None
        if not self._worth_it(claimant, models, chosen):
            self._undo(chosen)
            return None
        state = self.state
        overhead = state.config.restart_overhead_s
        for victim, reason in chosen:
            state.preempted.add(victim.workload.id)
            lost = lost_work(victim.workload, state.now)
            extra = victim.workload.total_gpus * overhead
            state.preemptions.append(Preemption(victim.workload.id, reason, claimant.id, lost, "", extra))
        return self.capacity.place_gang(
            models, claimant.gpus, claimant.replicas, claimant.cpu_milli, claimant.memory_mib, self.excluded
        )

    def _worth_it(self, claimant: Workload, models: tuple[str, ...], chosen: Chosen) -> bool:
        """Return whether preempting `chosen` (already released) costs less than the claimant's wait it saves."""
        now, overhead = self.state.now, self.state.config.restart_overhead_s
        cost = sum(lost_work(v.workload, now) + v.workload.total_gpus * overhead for v, _ in chosen)
        if cost <= 0:
            return True
        victims = {v.workload.id for v, _ in chosen}
        freed = sum(len(t.gpus) for v, _ in chosen for t in v.takes if t.model in models)
        # Free now, had the victims kept running: what the pool has free minus what they would free; it does not
        # fit that (fragmentation, a fabric), so at least one more end is needed, whatever the count says.
        free = min(self.capacity.free_gpus(models) - freed, claimant.total_gpus - 1)
        preempted = self.state.preempted
        for end, gpus, workload_id in self.ends:
            if workload_id in preempted and workload_id not in victims:
                continue  # preempted for someone else this pass: its GPUs are already counted free
            if math.isinf(end):
                return True  # nothing says when enough GPUs come back: waiting saves nothing for sure
            free += gpus
            if free >= claimant.total_gpus:
                return cost < claimant.total_gpus * max(0.0, end - now)
        return True

    @property
    def ends(self) -> list[tuple[float, int, str]]:
        """Return (planned end, GPUs, id) of the pool's running work, soonest first (computed once per pass)."""
        if self._ends is None:
            now = self.state.now
            self._ends = sorted((planned_end(w, now), w.total_gpus, w.id) for w in self.all_running)
        return self._ends

    def _node_by_node(self, claimant: Workload, models: tuple[str, ...]) -> Chosen | None:
        """Make room replica by replica where it costs fewest GPUs; [] asks for the in-order search, None gives up."""
        reserved: dict[tuple[int, str], int] = {}
        chosen: Chosen = []
        for _ in range(claimant.replicas):
            best = self._cheapest_node(claimant, models, reserved)
            if best is None:
                self._undo(chosen)
                return None
            _, number, model, victims = best
            for victim, reason in victims:
                self._release(victim)
                chosen.append((victim, reason))
            reserved[(number, model)] = reserved.get((number, model), 0) + claimant.gpus
            reserved[(number, "")] = reserved.get((number, ""), 0) + 1
        if self._fits(claimant, models):
            return self._prune(claimant, models, chosen)
        over_limit = not within_limits(self.state, claimant)
        self._undo(chosen)
        # Room was made but a limit still blocks: freeing more of the project in order may help; else nothing does.
        return [] if over_limit else None

    def _cheapest_node(
        self, claimant: Workload, models: tuple[str, ...], reserved: dict[tuple[int, str], int]
    ) -> tuple[int, int, str, Chosen] | None:
        """Return (GPUs freed, node, model, victims) of the node where one replica costs least; None if none can.

        Nodes are scanned by name, keeping the cheapest (GPUs, then victims);
        the scan stops at the first node that becomes the cheapest while
        freeing no more GPUs than it misses (`settled`). When checkpoints count
        (`weigh_lost`), a node that costs the same as the one kept replaces it
        if its victims lose less work (once settled, only a node that also
        frees no more than it misses), so the scan goes on to the end.
        """
        best: tuple[int, int, str, Chosen] | None = None
        best_lost, settled, weigh = 0.0, False, self.weigh_lost
        for node in self.capacity.nodes:
            number = node.number
            if number in self.excluded:
                continue
            cpu = claimant.cpu_milli * (1 + reserved.get((number, ""), 0)) - node.cpu
            memory = claimant.memory_mib * (1 + reserved.get((number, ""), 0)) - node.memory
            for model in models:
                if claimant.gpus and model not in node.models:
                    continue
                need = claimant.gpus - len(node.free.get(model, ())) + reserved.get((number, model), 0)
                if need <= 0 and cpu <= 0 and memory <= 0:
                    return (0, number, model, [])
                workloads = self.on_node(node.name)
                if not workloads:
                    break
                picked = self._victims_freeing(claimant, number, model, (need, cpu, memory), workloads)
                if picked is None:
                    continue
                cost = sum(victim.workload.total_gpus for victim, _ in picked)
                exact = cost == max(need, 0)  # nothing frees fewer GPUs than are missing
                lost = self._lost(picked) if weigh else 0.0
                key = (cost, len(picked))
                if best is None or (not settled and key < (best[0], len(best[3]))):
                    best, best_lost, settled = (cost, number, model, picked), lost, exact
                elif weigh and key == (best[0], len(best[3])) and lost < best_lost and (exact or not settled):
                    best, best_lost = (cost, number, model, picked), lost  # as cheap, and loses less
                if settled and best_lost == 0.0:
                    return best  # nothing loses less
        return best

    def _victims_freeing(
        self, claimant: Workload, number: int, model: str, missing: tuple[int, int, int], workloads: list[Workload]
    ) -> Chosen | None:
        """Return the first victims (in victim order) on a node that free the `missing` GPUs, CPU, memory; or None."""
        usable = []
        losing = self.losing
        for workload in workloads:
            if (workload.tenant, workload.project) not in losing:
                continue
            reason = preemption_reason(self.state, claimant, workload)
            if reason is not None:
                victim = self.victim(workload)
                usable.append((victim, reason, _frees(victim, number, model)))
        if any(sum(item[2][i] for item in usable) < missing[i] for i in range(3)):
            return None
        # One victim that is enough alone, holding the fewest GPUs, beats several.
        alone = [item for item in usable if all(item[2][i] >= missing[i] for i in range(3))]
        if alone:
            victim, reason, _ = min(alone, key=lambda item: item[0].workload.total_gpus)
            return [(victim, reason)]
        picked: Chosen = []
        freed = [0, 0, 0]
        for victim, _, gain in usable:
            # Released as it goes, so that the next victim's eligibility sees its owner's lower usage.
            reason_now = preemption_reason(self.state, claimant, victim.workload)
            if reason_now is None or not any(gain):
                continue
            self._release(victim)
            picked.append((victim, reason_now))
            freed = [freed[i] + gain[i] for i in range(3)]
            if all(freed[i] >= missing[i] for i in range(3)):
                break
        self._undo(picked)
        return picked if all(freed[i] >= missing[i] for i in range(3)) else None

    def _in_order(self, claimant: Workload, models: tuple[str, ...]) -> Chosen:
        """Add victims in victim order until the claimant fits; return them pruned, or [] with nothing changed."""
        chosen: Chosen = []
        wanted = set(models)
        for workload in self.ordered:
            reason = preemption_reason(self.state, claimant, workload)
            if reason is None:
                continue
            victim = self.victim(workload)
            takes = [take for take in victim.takes if take.node not in self.excluded]
            if not takes or (claimant.gpus and not any(take.model in wanted for take in takes)):
                continue  # frees nothing the claimant could use
            self._release(victim)
            chosen.append((victim, reason))
            if self._fits(claimant, models):
                return self._prune(claimant, models, chosen)
        self._undo(chosen)
        return []

    def _prune(self, claimant: Workload, models: tuple[str, ...], chosen: Chosen) -> Chosen:
        """Give back its place to every chosen victim the claimant fits without, largest first; return the rest."""
        kept = list(chosen)
        now, weigh = self.state.now, self.weigh_lost
        # Of victims as large, the one that would lose the most work is given back first.
        for item in sorted(
            chosen,
            key=lambda c: (
                -c[0].workload.total_gpus,
                -lost_work(c[0].workload, now) if weigh else 0.0,
                c[0].workload.id,
            ),
        ):
            self._restore(item[0])
            if self._fits(claimant, models):
                kept.remove(item)
            else:
                self._release(item[0])
        return kept

    def _fits(self, claimant: Workload, models: tuple[str, ...]) -> bool:
        if not within_limits(self.state, claimant):
            return False
        capacity = self.capacity
        takes = capacity.place_gang(
            models, claimant.gpus, claimant.replicas, claimant.cpu_milli, claimant.memory_mib, self.excluded
        )
        if takes is None:
            return False
        for take in reversed(takes):
            capacity.give(take)
        return True

    def _lost(self, chosen: Chosen) -> float:
        """Return the GPU-seconds the chosen victims would lose now."""
        return sum(lost_work(victim.workload, self.state.now) for victim, _ in chosen)

    def _release(self, victim: Victim) -> None:
        for take in victim.takes:
            self.capacity.give(take)
        self.state.charge(victim.workload, -1)
        self.state.preempted.add(victim.workload.id)

    def _restore(self, victim: Victim) -> None:
        for take in victim.takes:
            self.capacity.occupy(take)
        self.state.charge(victim.workload, 1)
        self.state.preempted.discard(victim.workload.id)

    def _undo(self, chosen: Chosen) -> None:
        for victim, _ in reversed(chosen):
            self._restore(victim)


def _frees(victim: Victim, node: int, model: str) -> tuple[int, int, int]:
    """Return the GPUs of `model`, CPU and memory stopping `victim` frees on node `node`."""
    takes = [take for take in victim.takes if take.node == node]
    return (
        sum(len(take.gpus) for take in takes if take.model == model),
        sum(take.cpu for take in takes),
        sum(take.memory for take in takes),
    )
