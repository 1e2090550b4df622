"""The storage filter: a workload goes only to nodes that can mount its volumes, or waits with NO_STORAGE."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.choices import ReasonCode
from jobs.scheduler.core import Node, Reason, Snapshot, Workload, schedule
from tests.jobs.scheduler.layouts import job, node, quota, running, snapshot
from tests.jobs.scheduler.test_core_properties import apply, check_invariants, clusters

QUOTAS = [quota("a", 8, 64), quota("b", 8, 64)]
BACKENDS = ("nfs", "s3", "ceph")


def mounting(name: str, *backends: str, **kwargs: Any) -> Node:
    """Return a node (see `layouts.node`) that can mount exactly `backends`."""
    return replace(node(name, **kwargs), storage=frozenset(backends))


def mounts(workload: Workload, *backends: str) -> Workload:
    return replace(workload, storage=frozenset(backends))


def test_a_workload_goes_to_a_node_that_can_mount_its_volumes_not_the_best_fit() -> None:
    nodes = [mounting("n1", "nfs", used=6), mounting("n2", "nfs", "s3"), node("n3", used=7)]
    pending = [mounts(job("vol", gpus=2), "nfs", "s3"), job("plain", gpus=1)]
    decisions = schedule(snapshot(nodes, QUOTAS, pending))
    assert {w: [r.node for r in rs] for w, rs in decisions.placements.items()} == {"vol": ["n2"], "plain": ["n3"]}


def test_room_only_on_nodes_that_cannot_mount_its_volumes_is_no_room_not_fairer_work_going_first() -> None:
    # At the start of the pass only n2 has room, and n2 cannot mount ceph; plain work of tenant b takes n2.
    nodes = [mounting("n1", "ceph", used=8), mounting("n2", "nfs")]
    pending = [job("plain", "b", gpus=8), mounts(job("vol", gpus=1), "ceph")]
    decisions = schedule(snapshot(nodes, QUOTAS, pending))
    assert list(decisions.placements) == ["plain"]
    assert decisions.waiting["vol"].reason is Reason.NO_CAPACITY, "its own nodes were full before anything went"


def test_a_node_without_a_storage_list_mounts_anything() -> None:
    # n1 is the best fit but mounts only nfs; n2 says nothing about storage.
    nodes = [mounting("n1", "nfs", used=7), node("n2", used=4)]
    decisions = schedule(snapshot(nodes, QUOTAS, [mounts(job("j"), "ceph")]))
    assert decisions.placements["j"][0].node == "n2"


def test_no_node_that_could_hold_it_mounts_its_volumes() -> None:
    # n2 mounts ceph but has 2 GPUs; n1 has 8 but mounts only nfs: the 4-GPU job could never start.
    nodes = [mounting("n1", "nfs"), mounting("n2", "ceph", "nfs", gpus=2)]
    decisions = schedule(snapshot(nodes, QUOTAS, [mounts(job("j", gpus=4), "ceph", "s3")]))
    waiting = decisions.waiting["j"]
    assert waiting.reason is Reason.NO_STORAGE
    assert waiting.message == (
        "None of the nodes of pool p that could hold 4 GPUs can mount its volumes (backends: ceph, s3)."
    )
    assert waiting.hint == "nodes of pool p that could hold it mount nfs"


def test_no_storage_hints_another_pool_where_it_would_start_now() -> None:
    nodes = [mounting("n1", "nfs"), mounting("q1", "nfs", pool="q", used=8), mounting("q2", "s3", pool="q")]
    quotas = [*QUOTAS, quota("a", 8, 64, pool="q")]
    decisions = schedule(snapshot(nodes, quotas, [mounts(job("j", gpus=2), "s3")]))
    assert decisions.waiting["j"].reason is Reason.NO_STORAGE
    assert decisions.waiting["j"].hint == "would start now in pool q"


def test_cpu_only_work_waits_for_no_storage_when_no_node_mounts_it() -> None:
    decisions = schedule(snapshot([mounting("n1", "nfs")], QUOTAS, [mounts(job("c", gpus=0, cpu=1_000), "s3")]))
    assert decisions.waiting["c"].reason is Reason.NO_STORAGE


def test_full_mountable_nodes_mean_no_capacity_and_do_not_block_other_work_of_the_same_shape() -> None:
    nodes = [mounting("n1", "nfs", used=8), mounting("n2", "s3", used=4)]
    pending = [mounts(job("vol", gpus=4, at=0.0), "nfs"), job("free", "b", gpus=4, at=1.0)]
    decisions = schedule(snapshot(nodes, QUOTAS, pending))
    assert decisions.waiting["vol"].reason is Reason.NO_CAPACITY
    assert decisions.waiting["vol"].hint is None
    assert decisions.placements["free"][0].node == "n2"


def test_the_fewer_gpus_hint_counts_only_nodes_that_can_mount() -> None:
    nodes = [mounting("n1", "nfs", used=6), mounting("n2", "s3", used=1)]
    decisions = schedule(snapshot(nodes, QUOTAS, [mounts(job("j", gpus=8), "nfs")]))
    assert decisions.waiting["j"].hint == "would start now with 2 GPUs"


def test_reclaim_makes_room_only_on_nodes_that_can_mount() -> None:
    # b borrows both nodes; a's claim mounts s3, so b1 on n2 (s3) goes although b0 on n1 is the newest.
    nodes = [mounting("n1", "nfs"), mounting("n2", "s3")]
    held = [
        running(job("b0", "b", gpus=8), ("n1", tuple(range(8))), started=2_000.0),
        running(job("b1", "b", gpus=8), ("n2", tuple(range(8))), started=1_000.0),
    ]
    quotas = [quota("a", 8, 16), quota("b", 0, 16)]
    decisions = schedule(snapshot(nodes, quotas, [mounts(job("a1", "a", gpus=8), "s3")], running_now=held))
    assert [p.victim for p in decisions.preemptions] == ["b1"]
    assert decisions.placements["a1"][0].node == "n2"


def test_the_choices_know_the_new_reason() -> None:
    assert ReasonCode(Reason.NO_STORAGE.value).label == "No node can mount its volumes"


@settings(max_examples=100, deadline=None)
@given(clusters(), st.randoms(use_true_random=False))
def test_nothing_lands_on_a_node_that_cannot_mount_it(first: Snapshot, rng: random.Random) -> None:
    def some_backends() -> frozenset[str]:
        return frozenset(rng.sample(BACKENDS, rng.randint(0, 2)))

    nodes = tuple(replace(n, storage=None if rng.random() < 0.3 else some_backends()) for n in first.nodes)
    pending = tuple(replace(w, storage=some_backends()) for w in first.pending)
    first = replace(first, nodes=nodes, pending=pending)
    second = apply(first, schedule(first), 5_000.0, [replace(w, id=f"late-{w.id}") for w in pending])
    decisions = schedule(second)
    check_invariants(second, decisions)
    by_name = {n.name: n for n in nodes}
    wanted = {w.id: w.storage for w in second.pending}
    for wid, replicas in decisions.placements.items():
        for replica in replicas:
            storage = by_name[replica.node].storage
            assert storage is None or wanted[wid] <= storage
    for wid, waiting in decisions.waiting.items():
        if waiting.reason is Reason.NO_STORAGE:
            assert wanted[wid]
