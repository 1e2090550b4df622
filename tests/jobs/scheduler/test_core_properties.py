"""Properties of the core over random clusters and workloads (hypothesis).

Running work is produced by the core itself (a first pass on an empty
cluster), so every snapshot is one the shell could really hand it.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduler.core import Decisions, Snapshot, Workload, schedule
from tests.jobs.scheduler.layouts import job, node, quota, snapshot

MODELS = ("A100", "T4")
TENANTS = ("a", "b", "c")


@st.composite
def clusters(draw: st.DrawFn) -> Snapshot:
    """Return a snapshot: 1-2 pools, up to 8 nodes with some failed GPUs, 3 tenants, up to 40 pending."""
    nodes = [
        node(
            f"n{i}",
            pool=draw(st.sampled_from(("p", "q"))),
            gpus=draw(st.sampled_from((1, 2, 4, 8))),
            model=draw(st.sampled_from(MODELS)),
            failed=tuple(draw(st.sets(st.integers(0, 7), max_size=2))),
            schedulable=draw(st.booleans()) or draw(st.booleans()),
        )
        for i in range(draw(st.integers(1, 8)))
    ]
    quotas = [
        quota(t, g, g + draw(st.integers(0, 16)), pool=pool, weight=draw(st.sampled_from((1.0, 2.0))))
        for t in TENANTS
        for pool in ("p", "q")
        if (g := draw(st.integers(0, 8))) is not None
    ]
    pending = [
        job(
            f"w{i}",
            draw(st.sampled_from(TENANTS)),
            project=draw(st.sampled_from(("x", "y"))),
            pool=draw(st.sampled_from(("p", "q"))),
            gpus=draw(st.sampled_from((0, 1, 1, 2, 4, 8))),
            replicas=draw(st.sampled_from((1, 1, 2, 3))),
            priority=draw(st.integers(0, 2)),
            at=float(draw(st.integers(0, 5))),
            models=draw(st.sampled_from(((), ("A100",), ("T4",), MODELS))),
        )
        for i in range(draw(st.integers(0, 40)))
    ]
    return snapshot(nodes, quotas, pending, now=0.0)


def apply(before: Snapshot, decisions: Decisions, now: float, arrivals: list[Workload]) -> Snapshot:
    """Return the snapshot at `now`: preempted work stops, placed work runs since `before.now`, arrivals queue."""
    preempted = {p.victim for p in decisions.preemptions}
    started = [
        replace(w, started_at=before.now, allocation=decisions.placements[w.id])
        for w in before.pending
        if w.id in decisions.placements
    ]
    running = [w for w in before.running if w.id not in preempted] + started
    pending = [w for w in before.pending if w.id not in decisions.placements] + arrivals
    return replace(before, now=now, running=tuple(running), pending=tuple(pending))


def check_invariants(before: Snapshot, decisions: Decisions) -> None:
    """Assert what every pass must hold, independently of how the core reached it."""
    gpus = {g.uuid: (n, g) for n in before.nodes for g in n.gpus}
    pending = {w.id: w for w in before.pending}
    preempted = {p.victim for p in decisions.preemptions}
    held = Counter(u for w in before.running if w.id not in preempted for r in w.allocation for u in r.gpu_uuids)
    # Every pending workload is either placed or waiting, never both.
    assert set(decisions.placements) | set(decisions.waiting) == set(pending)
    assert not set(decisions.placements) & set(decisions.waiting)
    for wid, replicas in decisions.placements.items():
        workload = pending[wid]
        assert len(replicas) == workload.replicas  # all of the gang, or (waiting) none of it
        for replica in replicas:
            assert len(replica.gpu_uuids) == workload.gpus
            for uuid in replica.gpu_uuids:
                host, gpu = gpus[uuid]
                assert host.name == replica.node and host.pool == workload.pool
                assert host.schedulable and gpu.healthy
                assert not workload.models or gpu.model in workload.models
                held[uuid] += 1
    assert all(count == 1 for count in held.values()), "a GPU is allocated twice"
    usage: Counter[tuple[str, str]] = Counter()
    for w in [*(w for w in before.running if w.id not in preempted), *(pending[i] for i in decisions.placements)]:
        usage[(w.pool, w.tenant)] += w.total_gpus
    limits = {(q.pool, q.tenant): q.limit for q in before.tenant_quotas}
    for key, used in usage.items():
        assert used <= limits.get(key, 0), f"{key} holds {used} GPUs over its limit"


def check_hints(before: Snapshot, decisions: Decisions) -> None:
    """Assert that every hint is true of the capacity and quotas the pass leaves (the layouts ask no CPU or memory)."""
    pending = {w.id: w for w in before.pending}
    preempted = {p.victim for p in decisions.preemptions}
    holders = [w for w in before.running if w.id not in preempted] + [pending[i] for i in decisions.placements]
    held = {u for w in holders for r in (decisions.placements.get(w.id) or w.allocation) for u in r.gpu_uuids}
    usage: Counter[tuple[str, str]] = Counter()
    for w in holders:
        usage[(w.pool, w.tenant)] += w.total_gpus
    limits = {(q.pool, q.tenant): q.limit for q in before.tenant_quotas}
    pools = {p.name: p for p in before.pools}

    def free(pool: str, w: Workload) -> list[int]:
        return [
            sum(1 for g in n.gpus if g.healthy and g.free and g.uuid not in held and g.model in (w.models or MODELS))
            for n in before.nodes
            if n.pool == pool and n.schedulable
        ]

    for wid, waiting in decisions.waiting.items():
        w = pending[wid]
        if waiting.hint is None:
            continue
        if waiting.hint.startswith("would start now in pool "):
            pool = waiting.hint.removeprefix("would start now in pool ")
            assert pool != w.pool and not pools[pool].cordoned
            assert pools[pool].dedicated_tenant in (None, w.tenant)
            assert usage[(pool, w.tenant)] + w.total_gpus <= limits[(pool, w.tenant)]
            slots = free(pool, w)
            assert slots and (not w.gpus or sum(f // w.gpus for f in slots) >= w.replicas)
        else:
            fewer = int(waiting.hint.removeprefix("would start now with ").split()[0])
            assert w.replicas == 1 and 0 < fewer < w.gpus and max(free(w.pool, w)) == fewer


@settings(max_examples=150, deadline=None)
@given(clusters(), st.randoms(use_true_random=False))
def test_two_passes_keep_every_invariant(first: Snapshot, rng: random.Random) -> None:
    decisions = schedule(first)
    check_invariants(first, decisions)
    check_hints(first, decisions)
    arrivals = [replace(w, id=f"late-{w.id}", submitted_at=w.submitted_at + 100) for w in first.pending]
    second = apply(first, decisions, 5_000.0, rng.sample(arrivals, len(arrivals) // 2))
    decisions = schedule(second)
    check_invariants(second, decisions)
    check_hints(second, decisions)


@settings(max_examples=100, deadline=None)
@given(clusters(), st.randoms(use_true_random=False))
def test_same_snapshot_same_decisions_whatever_the_input_order(first: Snapshot, rng: random.Random) -> None:
    second = apply(first, schedule(first), 5_000.0, [replace(w, id=f"late-{w.id}") for w in first.pending])
    shuffled = replace(
        second,
        nodes=tuple(rng.sample(second.nodes, len(second.nodes))),
        pending=tuple(rng.sample(second.pending, len(second.pending))),
        running=tuple(rng.sample(second.running, len(second.running))),
    )
    assert schedule(second) == schedule(second) == schedule(shuffled)


@settings(max_examples=100, deadline=None)
@given(
    nodes=st.integers(1, 6),
    borrower_guarantee=st.integers(0, 8),
    sizes=st.lists(st.sampled_from((1, 2, 4, 8)), min_size=1, max_size=12),
)
def test_a_tenant_below_its_guarantee_gets_it_after_reclaim(
    nodes: int, borrower_guarantee: int, sizes: list[int]
) -> None:
    capacity = 8 * nodes
    guarantee = capacity - min(borrower_guarantee, capacity)
    demand: list[int] = []
    for size in sizes:  # power-of-two sizes on 8-GPU nodes always pack; keep within the guarantee
        if sum(demand) + size <= guarantee:
            demand.append(size)
    cluster = [node(f"n{i}") for i in range(nodes)]
    quotas = [quota("a", guarantee, capacity), quota("b", capacity - guarantee, capacity)]
    filler = [job(f"b{i}", "b", at=float(i)) for i in range(capacity)]
    first = snapshot(cluster, quotas, filler, now=0.0)
    claims = [job(f"a{i}", "a", gpus=size, at=1_000.0 + i) for i, size in enumerate(demand)]
    second = apply(first, schedule(first), 5_000.0, claims)
    decisions = schedule(second)
    check_invariants(second, decisions)
    assert sorted(decisions.placements) == sorted(w.id for w in claims)
