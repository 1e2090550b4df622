"""Gangs across hosts: a gang spreads over several nodes only inside one Docker swarm, with a manager among them."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduler.core import Decisions, Node, Reason, Snapshot, schedule
from jobs.scheduler.core.explain import SPAN_NOTE
from tests.jobs.scheduler.layouts import job, node, quota, running, snapshot
from tests.jobs.scheduler.test_core_properties import apply, check_invariants, clusters

QUOTAS = [quota("a", 32, 64), quota("b", 32, 64)]


def docker(name: str, swarm: str = "", *, manager: bool = False, used: int = 0, gpus: int = 8) -> Node:
    """Return a Docker node (see `layouts.node`) in swarm `swarm` ("" for none)."""
    return replace(node(name, used=used, gpus=gpus), fabric=swarm, fabric_manager=manager)


def nodes_of(decisions: Decisions, workload: str) -> list[str]:
    return [replica.node for replica in decisions.placements[workload]]


def test_without_a_swarm_a_gang_stays_on_one_node_though_best_fit_would_spread_it() -> None:
    # Best fit alone puts one replica on each of n1 and n2 (the fullest nodes with 4 free); n3 holds both.
    nodes = [docker("n1", used=4), docker("n2", used=4), docker("n3")]
    decisions = schedule(snapshot(nodes, QUOTAS, [job("g", gpus=4, replicas=2)]))
    assert nodes_of(decisions, "g") == ["n3", "n3"]


def test_the_same_pool_of_nodes_that_need_no_swarm_spreads_the_gang_by_best_fit() -> None:
    nodes = [node("n1", used=4), node("n2", used=4), node("n3")]
    decisions = schedule(snapshot(nodes, QUOTAS, [job("g", gpus=4, replicas=2)]))
    assert nodes_of(decisions, "g") == ["n1", "n2"]


def test_in_one_swarm_with_a_manager_among_them_a_gang_spreads_by_best_fit() -> None:
    nodes = [docker("n1", "s", manager=True, used=4), docker("n2", "s", used=4), docker("n3", "s")]
    decisions = schedule(snapshot(nodes, QUOTAS, [job("g", gpus=4, replicas=2)]))
    assert nodes_of(decisions, "g") == ["n1", "n2"]


def test_spread_over_workers_alone_one_replica_moves_to_a_manager() -> None:
    # n1 and n2 (workers) are the best fit; the manager n3 must hold one replica, which makes the gang's network.
    nodes = [docker("n1", "s", used=4), docker("n2", "s", used=4), docker("n3", "s", manager=True, used=2)]
    decisions = schedule(snapshot(nodes, QUOTAS, [job("g", gpus=4, replicas=2)]))
    placed = nodes_of(decisions, "g")
    assert "n3" in placed and len(set(placed)) == 2


def test_a_gang_never_spans_two_swarms_or_a_swarm_and_a_node_outside() -> None:
    nodes = [
        docker("n1", "s1", manager=True, used=4),
        docker("n2", "s2", manager=True, used=4),
        docker("n3", "", used=4),
        docker("n4", "s2", used=4),
    ]
    decisions = schedule(snapshot(nodes, QUOTAS, [job("g", gpus=4, replicas=2)]))
    assert sorted(nodes_of(decisions, "g")) == ["n2", "n4"]


def test_a_swarm_without_a_manager_in_the_pool_cannot_carry_a_gang_across_hosts() -> None:
    nodes = [docker("n1", "s", used=4), docker("n2", "s", used=4)]
    decisions = schedule(snapshot(nodes, QUOTAS, [job("g", gpus=4, replicas=2)]))
    waiting = decisions.waiting["g"]
    assert waiting.reason is Reason.GANG_CANNOT_FIT
    assert waiting.message == (
        "Enough GPUs are free in pool p, but not together on few enough nodes to hold 2 replicas of 4 GPUs each"
        f" at once. {SPAN_NOTE}"
    )


def test_a_cpu_only_gang_that_would_fit_only_across_nodes_outside_a_swarm_says_so() -> None:
    nodes = [replace(docker("n1"), cpu_free_milli=1_000), replace(docker("n2"), cpu_free_milli=1_000)]
    decisions = schedule(snapshot(nodes, QUOTAS, [job("c", gpus=0, cpu=1_000, replicas=2)]))
    waiting = decisions.waiting["c"]
    assert waiting.reason is Reason.GANG_CANNOT_FIT
    assert waiting.message.endswith(SPAN_NOTE)


def test_a_gang_waits_rather_than_spanning_nodes_outside_a_swarm_and_other_work_still_starts() -> None:
    nodes = [docker("n1", used=4), docker("n2", used=4)]
    pending = [job("g", gpus=4, replicas=2, at=0.0), job("one", "b", gpus=4, at=1.0)]
    decisions = schedule(snapshot(nodes, QUOTAS, pending))
    assert decisions.waiting["g"].reason is Reason.GANG_CANNOT_FIT
    assert nodes_of(decisions, "one") == ["n1"]


def test_a_node_that_never_reported_its_swarm_limits_nothing() -> None:
    # fabric None: a Docker node whose agent predates the report keeps the old behaviour.
    nodes = [node("n1", used=4), node("n2", used=4)]
    decisions = schedule(snapshot(nodes, QUOTAS, [job("g", gpus=4, replicas=2)]))
    assert nodes_of(decisions, "g") == ["n1", "n2"]


def test_the_message_of_a_gang_that_cannot_fit_says_nothing_of_swarms_where_none_limits_it() -> None:
    nodes = [node("n1", used=6), node("n2", used=6)]
    decisions = schedule(snapshot(nodes, QUOTAS, [job("g", gpus=3, replicas=1)]))
    assert SPAN_NOTE not in decisions.waiting["g"].message


def test_reclaim_for_a_gang_frees_room_inside_one_swarm() -> None:
    # 4 GPUs are free on each of n1 (swarm s1) and n2 (swarm s2); b borrows the rest, 4 GPUs above its fair share.
    # a's 2 x 4 gang may not span two swarms: one of b's workloads on n1 goes and the gang takes all of n1.
    nodes = [docker("n1", "s1", manager=True), docker("n2", "s2", manager=True), docker("n3", "s2")]
    held = [
        running(job("b0", "b", gpus=4), ("n1", (0, 1, 2, 3)), started=3_000.0),
        running(job("b1", "b", gpus=4), ("n2", (0, 1, 2, 3)), started=2_000.0),
        running(job("b2", "b", gpus=8), ("n3", tuple(range(8))), started=1_000.0),
    ]
    quotas = [quota("a", 12, 24), quota("b", 0, 24)]
    pending = [job("a1", "a", gpus=4, replicas=2, at=0.0), job("a2", "a", gpus=4, at=1.0)]
    decisions = schedule(snapshot(nodes, quotas, pending, running_now=held))
    assert [p.victim for p in decisions.preemptions] == ["b0"], "the newest borrower goes"
    assert nodes_of(decisions, "a1") == ["n1", "n1"]
    assert nodes_of(decisions, "a2") == ["n2"]


@settings(max_examples=100, deadline=None)
@given(clusters(), st.randoms(use_true_random=False))
def test_no_gang_lands_on_nodes_that_may_not_share_it(first: Snapshot, rng: random.Random) -> None:
    def fabric() -> tuple[str | None, bool]:
        choice = rng.random()
        if choice < 0.2:
            return None, False
        if choice < 0.4:
            return "", False
        return rng.choice(("s1", "s2")), rng.random() < 0.3

    nodes = tuple(replace(n, fabric=f, fabric_manager=m) for n in first.nodes for f, m in [fabric()])
    first = replace(first, nodes=nodes)
    second = apply(first, schedule(first), 5_000.0, [replace(w, id=f"late-{w.id}") for w in first.pending])
    decisions = schedule(second)
    check_invariants(second, decisions)
    by_name = {n.name: n for n in nodes}
    for replicas in decisions.placements.values():
        used = {by_name[r.node] for r in replicas}
        if len(used) > 1:
            fabrics = {n.fabric for n in used}
            assert len(fabrics) == 1
            assert None in fabrics or ("" not in fabrics and any(n.fabric_manager for n in used))
