"""Making room by preemption: reclaiming guarantees from borrowers, and priority inside a project.

Victims are ordered lowest-priority and newest first. For each replica of the
claimant, the node where making room frees the fewest GPUs is chosen; if that
does not work out (CPU, memory, a limit), victims are added in order until
the claimant fits. Then each chosen victim is given back its place, largest
first, whenever the claimant still fits without it: a minimal set (no single
victim can be spared), not always the global minimum.

Preemption is rare and a loaded cluster runs thousands of workloads, so
nothing here is built before a pass first needs it, and owners that cannot
lose work are ruled out before any of their workloads is looked at.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from jobs.scheduler.core.capacity import PoolCapacity, Take
from jobs.scheduler.core.model import Preemption, Reason, Workload, WorkloadKind
from jobs.scheduler.core.state import PassState, project_key, tenant_key

_EPSILON = 1e-9

Chosen = list[tuple["Victim", Reason]]


@dataclass(frozen=True, slots=True)
class Victim:
    """A running workload that could be preempted, and what stopping it frees in its pool."""

    workload: Workload
    takes: tuple[Take, ...]


def victim_order(workload: Workload) -> tuple[int, float, str]:
    """Return the sort key putting the lowest-priority, newest workloads first."""
    return (workload.priority, -(workload.started_at or 0.0), workload.id)


class Reclaimer:
    """Preemption in one pool for one pass: its running workloads, indexed by node on first use."""

    def __init__(self, state: PassState, capacity: PoolCapacity, running: list[Workload]) -> None:
        self.state = state
        self.capacity = capacity
        oldest = state.now - state.config.min_runtime_s
        # Too young to preempt now stays too young for the whole pass.
        self.running = [w for w in running if w.started_at is not None and w.started_at <= oldest]
        # Per owner (tenant, project): its lowest running priority and one of its workloads.
        self.owners: dict[tuple[str, str], tuple[int, Workload]] = {}
        for workload in self.running:
            key = (workload.tenant, workload.project)
            if key not in self.owners or workload.priority < self.owners[key][0]:
                self.owners[key] = (workload.priority, workload)
        self._ordered: list[Workload] | None = None
        self._on_node: dict[str, list[Workload]] | None = None
        self._sorted_nodes: set[str] = set()
        self._victims: dict[str, Victim] = {}
        self.losing: set[tuple[str, str]] = set()

    @property
    def ordered(self) -> list[Workload]:
        """Return every preemptible-by-age workload of the pool in victim order."""
        if self._ordered is None:
            self._ordered = sorted(self.running, key=victim_order)
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
            workloads.sort(key=victim_order)
            self._sorted_nodes.add(name)
        return workloads

    def victim(self, workload: Workload) -> Victim:
        """Return what stopping `workload` frees (computed once per pass)."""
        victim = self._victims.get(workload.id)
        if victim is None:
            victim = self._victims[workload.id] = self._victim(workload)
        return victim

    def _victim(self, workload: Workload) -> Victim:
        takes: list[Take] = []
        for replica in workload.allocation:
            number = self.capacity.number_of.get(replica.node)
            if number is None:
                continue  # on a node that takes no new work: stopping it frees nothing usable
            by_model: dict[str, list[tuple[int, str]]] = {}
            for uuid in replica.gpu_uuids:
                if uuid in self.capacity.gpu_of:
                    index, model = self.capacity.gpu_of[uuid]
                    by_model.setdefault(model, []).append((index, uuid))
            cpu, memory = workload.cpu_milli, workload.memory_mib
            for model, gpus in sorted(by_model.items()) or [("", [])]:
                takes.append(Take(number, model, tuple(sorted(gpus)), cpu, memory))
                cpu = memory = 0  # a replica's CPU and memory are counted once
        return Victim(workload, tuple(takes))

    def losing_owners(self, claimant: Workload) -> set[tuple[str, str]]:
        """Return the (tenant, project) owners that could lose work to `claimant` now (a superset: a cheap filter)."""
        state = self.state
        within = state.within_guarantee(claimant)
        owners = set()
        for (tenant, project), (lowest, workload) in self.owners.items():
            if tenant == claimant.tenant and project == claimant.project:
                if lowest < claimant.priority:
                    owners.add((tenant, project))
            elif within and _owner_above_fair_share(state, claimant, workload):
                owners.add((tenant, project))
        return owners

    def make_room(self, claimant: Workload, models: tuple[str, ...]) -> list[Take] | None:
        """Preempt few victims so that `claimant` fits, place it and return its takes; on None nothing changed."""
        self.losing = self.losing_owners(claimant)
        if not self.losing:
            return None
        chosen = self._node_by_node(claimant, models)
        if chosen is None:
            return None  # no node can be freed for some replica: more victims in any order would not help
        if not chosen:
            chosen = self._in_order(claimant, models)
        if not chosen:
            return None
        state = self.state
        for victim, reason in chosen:
            state.preempted.add(victim.workload.id)
            state.preemptions.append(Preemption(victim.workload.id, reason, claimant.id))
        return self.capacity.place_gang(
            models, claimant.gpus, claimant.replicas, claimant.cpu_milli, claimant.memory_mib
        )

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
        """Return (GPUs freed, node, model, victims) of the node where one replica costs least; None if none can."""
        best: tuple[int, int, str, Chosen] | None = None
        for node in self.capacity.nodes:
            number = node.number
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
                if best is None or (cost, len(picked)) < (best[0], len(best[3])):
                    best = (cost, number, model, picked)
                    if cost == max(need, 0):
                        return best  # nothing frees fewer GPUs than are missing
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
            if claimant.gpus and not any(take.model in wanted for take in victim.takes):
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
        for item in sorted(chosen, key=lambda c: (-c[0].workload.total_gpus, c[0].workload.id)):
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
        takes = capacity.place_gang(models, claimant.gpus, claimant.replicas, claimant.cpu_milli, claimant.memory_mib)
        if takes is None:
            return False
        for take in reversed(takes):
            capacity.give(take)
        return True

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


def preemption_reason(state: PassState, claimant: Workload, victim: Workload) -> Reason | None:
    """Return why `victim` may be preempted for `claimant` now, or None when it may not."""
    if victim.id in state.preempted or victim.started_at is None:
        return None
    if state.now - victim.started_at < state.config.min_runtime_s or _protected_notebook(state, victim):
        return None
    if victim.tenant == claimant.tenant and victim.project == claimant.project:
        return Reason.PRIORITY if victim.priority < claimant.priority else None
    if not _owner_above_fair_share(state, claimant, victim) or not state.within_guarantee(claimant):
        return None
    if victim.tenant != claimant.tenant:
        key = tenant_key(victim)
        usage, quota = state.tenant_usage[key], state.tenant_quota(key)
    else:
        pkey = project_key(victim)
        usage, quota = state.project_usage[pkey], state.project_quota(pkey)
    # Only owners above their fair share lose work, and never below their own guarantee.
    return Reason.RECLAIM_GUARANTEE if usage - victim.total_gpus >= quota.guaranteed else None


def _owner_above_fair_share(state: PassState, claimant: Workload, victim: Workload) -> bool:
    """Return whether the victim's owner (another tenant, or a sibling project) is above its fair share."""
    if victim.tenant != claimant.tenant:
        key = tenant_key(victim)
        return state.tenant_usage[key] > state.tenant_fair.get(key, 0.0) + _EPSILON
    pkey = project_key(victim)
    return state.project_usage[pkey] > state.project_fair.get(pkey, 0.0) + _EPSILON


def within_limits(state: PassState, workload: Workload) -> bool:
    """Return whether placing the workload keeps its tenant and project within their limits."""
    tenant, project = tenant_key(workload), project_key(workload)
    return (
        state.tenant_usage[tenant] + workload.total_gpus <= state.tenant_quota(tenant).limit
        and state.project_usage[project] + workload.total_gpus <= state.project_quota(project).limit
    )


def _protected_notebook(state: PassState, victim: Workload) -> bool:
    key = project_key(victim)
    return victim.kind is WorkloadKind.NOTEBOOK and state.project_usage[key] <= state.project_quota(key).guaranteed
