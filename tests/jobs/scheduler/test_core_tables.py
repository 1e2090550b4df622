"""The scheduler core as tables: a cluster layout, quotas and workloads in, expected decisions out."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from jobs.scheduler.core import (
    Node,
    Ordering,
    PlacementPolicy,
    Pool,
    ProjectQuota,
    Reason,
    SchedulerConfig,
    TenantQuota,
    Workload,
    WorkloadKind,
    schedule,
)
from tests.jobs.scheduler.layouts import job, node, project_quota, quota, running, snapshot

FIFO = SchedulerConfig(ordering=Ordering.FIFO)


@dataclass
class Case:
    """One table row: the layout, and what must be decided (workload id -> node names; id -> reason)."""

    name: str
    nodes: list[Node]
    quotas: list[TenantQuota]
    pending: list[Workload]
    placed: dict[str, list[str]] = field(default_factory=dict)
    waiting: dict[str, Reason] = field(default_factory=dict)
    preempted: dict[str, Reason] = field(default_factory=dict)
    running_now: list[Workload] = field(default_factory=list)
    projects: list[ProjectQuota] = field(default_factory=list)
    pools: list[Pool] | None = None
    config: SchedulerConfig | None = None


BIG = [quota("a", 8, 64), quota("b", 8, 64)]

CASES = [
    Case(
        "best fit takes the fullest node that still fits",
        [node("n1"), node("n2", used=6)],
        BIG,
        [job("j1", gpus=2)],
        placed={"j1": ["n2"]},
    ),
    Case(
        "best fit does not strand a GPU without the CPU to use it",
        [node("n1", gpus=2, cpu=16_000), node("n2", gpus=4, used=1, cpu=64_000)],
        BIG,
        [job("j", cpu=12_000)],
        placed={"j": ["n2"]},
    ),
    Case(
        "work that can use stranded GPUs goes there first",
        [node("n1", gpus=2, cpu=64_000), replace(node("n9", gpus=2, cpu=16_000), cpu_free_milli=8_000)],
        BIG,
        [job("j", gpus=2, cpu=4_000)],
        placed={"j": ["n9"]},
    ),
    Case(
        "CPU-only work does not take the CPU a free GPU needs",
        [node("n1", gpus=2, used=1, cpu=16_000), node("n2", used=4, cpu=96_000)],
        BIG,
        [job("c", gpus=0, cpu=12_000)],
        placed={"c": ["n2"]},
    ),
    Case(
        "spread takes the emptiest node",
        [node("n1"), node("n2", used=6)],
        BIG,
        [job("j1", gpus=2)],
        pools=[Pool("p", PlacementPolicy.SPREAD)],
        placed={"j1": ["n1"]},
    ),
    Case(
        "a gang spans nodes, all replicas at once",
        [node("n1"), node("n2"), node("n3", used=4)],
        BIG,
        [job("g", gpus=8, replicas=2)],
        placed={"g": ["n1", "n2"]},
    ),
    Case(
        "a gang that fits by count but not by node waits whole",
        [node("n1"), node("n2", used=4), node("n3", used=4)],
        BIG,
        [job("g", gpus=8, replicas=2)],
        waiting={"g": Reason.GANG_CANNOT_FIT},
    ),
    Case(
        "no GPU of the asked model",
        [node("n1")],
        BIG,
        [job("j", models=("H100",))],
        waiting={"j": Reason.NO_CAPACITY_FOR_MODEL},
    ),
    Case(
        "a model constraint picks the right nodes",
        [node("n1", model="T4"), node("n2", model="V100", used=4)],
        BIG,
        [job("j", gpus=2, models=("V100",))],
        placed={"j": ["n2"]},
    ),
    Case(
        "more GPUs per replica than any node has",
        [node("n1"), node("n2")],
        BIG,
        [job("j", gpus=16)],
        waiting={"j": Reason.NO_CAPACITY_FOR_MODEL},
    ),
    Case(
        "failed GPUs and unschedulable nodes are never used",
        [node("n1", failed=(0, 1, 2, 3, 4, 5, 6)), node("n2", schedulable=False)],
        BIG,
        [job("j1"), job("j2", at=1)],
        placed={"j1": ["n1"]},
        waiting={"j2": Reason.NO_CAPACITY},
    ),
    Case(
        "the tenant limit holds",
        [node("n1")],
        [quota("a", 2, 4)],
        [job("j1", gpus=4), job("j2", gpus=1, at=1)],
        placed={"j1": ["n1"]},
        waiting={"j2": Reason.QUOTA_LIMIT},
    ),
    Case(
        "the project limit holds inside the tenant's",
        [node("n1")],
        [quota("a", 8, 8)],
        [job("j1", project="x", gpus=2), job("j2", project="x", gpus=1, at=1), job("j3", project="y", at=2)],
        projects=[project_quota("x", "a", 1, 2), project_quota("y", "a", 1, 6)],
        placed={"j1": ["n1"], "j3": ["n1"]},
        waiting={"j2": Reason.QUOTA_LIMIT},
    ),
    Case(
        "no quota in the pool means no GPUs there",
        [node("n1")],
        [quota("a", 2, 4)],
        [job("j", "b")],
        waiting={"j": Reason.QUOTA_LIMIT},
    ),
    Case(
        "a cordoned pool starts nothing",
        [node("n1")],
        BIG,
        [job("j")],
        pools=[Pool("p", cordoned=True)],
        waiting={"j": Reason.POOL_CORDONED},
    ),
    Case(
        "a dedicated pool serves only its tenant",
        [node("n1")],
        BIG,
        [job("ja", "a"), job("jb", "b")],
        pools=[Pool("p", dedicated_tenant="a")],
        placed={"ja": ["n1"]},
        waiting={"jb": Reason.DEDICATED_POOL},
    ),
    Case(
        "a workload naming a missing pool waits",
        [node("n1")],
        BIG,
        [job("j", pool="nowhere")],
        waiting={"j": Reason.UNKNOWN_POOL},
    ),
    Case(
        "CPU-only work is placed by CPU and memory",
        [node("n1", cpu=4_000), node("n2", cpu=16_000)],
        BIG,
        [job("c1", gpus=0, cpu=8_000, memory=1_000), job("c2", gpus=0, cpu=16_000, memory=1_000, at=1)],
        placed={"c1": ["n2"]},
        waiting={"c2": Reason.NO_CAPACITY},
    ),
    Case(
        "fair share: equal weights split a contended pool evenly, earlier submission notwithstanding",
        [node("n1", gpus=4)],
        [quota("a", 0, 4), quota("b", 0, 4)],
        [job(f"a{i}", "a", at=i) for i in range(4)] + [job(f"b{i}", "b", at=10 + i) for i in range(4)],
        placed={"a0": ["n1"], "a1": ["n1"], "b0": ["n1"], "b1": ["n1"]},
        waiting={"a2": Reason.WAITING_FOR_FAIRER_WORK, "b2": Reason.WAITING_FOR_FAIRER_WORK},
    ),
    Case(
        "fair share: weights split idle capacity",
        [node("n1", gpus=4)],
        [quota("a", 0, 4, weight=3), quota("b", 0, 4, weight=1)],
        [job(f"a{i}", "a", at=10 + i) for i in range(4)] + [job(f"b{i}", "b", at=i) for i in range(4)],
        placed={"a0": ["n1"], "a1": ["n1"], "a2": ["n1"], "b0": ["n1"]},
    ),
    Case(
        "priority orders work inside a project",
        [node("n1", gpus=1)],
        BIG,
        [job("low", at=0, priority=0), job("high", at=5, priority=10)],
        placed={"high": ["n1"]},
        waiting={"low": Reason.WAITING_FOR_HIGHER_PRIORITY},
    ),
    Case(
        "reclaim: the newest borrower holding the fewest GPUs that make room is preempted",
        [node("n1")],
        [quota("a", 4, 8), quota("b", 4, 8)],
        [job("a1", "a", gpus=2, at=500)],
        running_now=[
            running(job("b1", "b", gpus=2), ("n1", (0, 1)), started=0),
            running(job("b2", "b", gpus=2), ("n1", (2, 3)), started=100),
            running(job("b3", "b", gpus=4), ("n1", (4, 5, 6, 7)), started=200),
        ],
        placed={"a1": ["n1"]},
        preempted={"b2": Reason.RECLAIM_GUARANTEE},
    ),
    Case(
        "reclaim waits for the minimum runtime",
        [node("n1")],
        [quota("a", 4, 8), quota("b", 4, 8)],
        [job("a1", "a", gpus=2, at=500)],
        running_now=[running(job("b1", "b", gpus=8), ("n1", tuple(range(8))), started=9_900)],
        waiting={"a1": Reason.NO_CAPACITY},
    ),
    Case(
        "work beyond its guarantee does not reclaim",
        [node("n1")],
        [quota("a", 1, 8), quota("b", 4, 8)],
        [job("a1", "a", gpus=2, at=500)],
        running_now=[running(job("b1", "b", gpus=8), ("n1", tuple(range(8))), started=0)],
        waiting={"a1": Reason.NO_CAPACITY},
    ),
    Case(
        "reclaim never takes a borrower below its own guarantee",
        [node("n1")],
        [quota("a", 4, 8), quota("b", 4, 8)],
        [job("a1", "a", gpus=2, at=500)],
        running_now=[
            running(job("b1", "b", gpus=6), ("n1", (0, 1, 2, 3, 4, 5)), started=0),
            running(job("b2", "b", gpus=1), ("n1", (6,)), started=10),
            running(job("b3", "b", gpus=1), ("n1", (7,)), started=20),
        ],
        placed={"a1": ["n1"]},
        preempted={"b2": Reason.RECLAIM_GUARANTEE, "b3": Reason.RECLAIM_GUARANTEE},
    ),
    Case(
        "notebooks within their project's guarantee are never preempted",
        [node("n1", gpus=4)],
        [quota("a", 2, 4), quota("b", 2, 4)],
        [job("a1", "a", gpus=2, at=500)],
        projects=[project_quota("nb", "b", 2, 4), project_quota("a", "a", 2, 4)],
        running_now=[
            running(job("n1", "b", project="nb", gpus=2, kind=WorkloadKind.NOTEBOOK), ("n1", (0, 1)), started=0),
            running(job("j1", "b", project="jobs", gpus=2), ("n1", (2, 3)), started=10),
        ],
        placed={"a1": ["n1"]},
        preempted={"j1": Reason.RECLAIM_GUARANTEE},
    ),
    Case(
        "high priority preempts low inside a project",
        [node("n1", gpus=4)],
        [quota("a", 0, 4)],
        [job("urgent", "a", gpus=2, priority=10, at=500)],
        running_now=[
            running(job("old", "a", gpus=2, priority=0), ("n1", (0, 1)), started=0),
            running(job("vip", "a", gpus=2, priority=20), ("n1", (2, 3)), started=10),
        ],
        placed={"urgent": ["n1"]},
        preempted={"old": Reason.PRIORITY},
    ),
    Case(
        "fifo: nothing skips past a blocked head",
        [node("n1", gpus=4)],
        BIG,
        [job("big", gpus=8, at=0), job("small", gpus=1, at=1)],
        config=FIFO,
        waiting={"big": Reason.NO_CAPACITY_FOR_MODEL, "small": Reason.BEHIND_QUEUE_HEAD},
    ),
    Case(
        "fair share skips past a workload that does not fit",
        [node("n1", gpus=4)],
        BIG,
        [job("big", gpus=8, at=0), job("small", gpus=1, at=1)],
        placed={"small": ["n1"]},
        waiting={"big": Reason.NO_CAPACITY_FOR_MODEL},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_layout(case: Case) -> None:
    decisions = schedule(
        snapshot(
            case.nodes,
            case.quotas,
            case.pending,
            running_now=case.running_now,
            projects=case.projects,
            pools=case.pools,
            config=case.config,
        )
    )
    placed = {wid: [r.node for r in replicas] for wid, replicas in decisions.placements.items()}
    assert placed == case.placed
    assert {wid: w.reason for wid, w in decisions.waiting.items()} == {
        **case.waiting,
        **{w.id: decisions.waiting[w.id].reason for w in case.pending if w.id not in case.waiting | case.placed},
    }
    for wid in case.waiting:
        assert decisions.waiting[wid].message
    assert {p.victim: p.reason for p in decisions.preemptions} == case.preempted


def test_placed_gpus_are_the_requested_count_and_free_ones() -> None:
    decisions = schedule(snapshot([node("n1", used=3)], BIG, [job("j", gpus=4)]))
    assert decisions.placements["j"][0].gpu_uuids == ("n1-gpu3", "n1-gpu4", "n1-gpu5", "n1-gpu6")


def test_positions_count_within_the_pool_in_queue_order() -> None:
    nodes = [node("n1", gpus=1), node("m1", pool="q", gpus=1)]
    quotas = [quota("a", 0, 8), quota("a", 0, 8, pool="q")]
    pending = [job("p0", at=0), job("p1", at=1), job("p2", at=2), job("q0", pool="q", at=0), job("q1", pool="q", at=1)]
    decisions = schedule(snapshot(nodes, quotas, pending))
    assert {w: v.position for w, v in decisions.waiting.items()} == {"p1": 1, "p2": 2, "q1": 1}


def test_hint_names_fewer_gpus_that_would_start_now() -> None:
    decisions = schedule(snapshot([node("n1", used=6), node("n2", used=5)], BIG, [job("j", gpus=4)]))
    assert decisions.waiting["j"].reason is Reason.GANG_CANNOT_FIT
    assert decisions.waiting["j"].hint == "would start now with 3 GPUs"


@dataclass
class HintCase:
    """A hint table row: pool p holds one 2-GPU A100 node; the layout adds pool q; `j` (tenant a) waits in p."""

    name: str
    hint: str | None
    job: Workload = field(default_factory=lambda: job("j", gpus=4))
    other: list[Node] = field(default_factory=lambda: [node("m1", pool="q")])
    quotas: list[TenantQuota] = field(default_factory=lambda: [quota("a", 0, 8, pool="q")])
    projects: list[ProjectQuota] = field(default_factory=list)
    pools: list[Pool] = field(default_factory=lambda: [Pool("q")])
    also_pending: list[Workload] = field(default_factory=list)
    running_now: list[Workload] = field(default_factory=list)


FEWER = "would start now with 2 GPUs"

HINT_CASES = [
    HintCase("another pool the tenant may use has room", "would start now in pool q"),
    HintCase(
        "a gang that fits the other pool only across its nodes",
        "would start now in pool q",
        job=job("j", gpus=8, replicas=2),
        other=[node("m1", pool="q"), node("m2", pool="q")],
        quotas=[quota("a", 0, 16, pool="q")],
    ),
    HintCase("the other pool is dedicated to another tenant", FEWER, pools=[Pool("q", dedicated_tenant="b")]),
    HintCase("the other pool is cordoned", FEWER, pools=[Pool("q", cordoned=True)]),
    HintCase("no tenant quota in the other pool", FEWER, quotas=[quota("b", 0, 8, pool="q")]),
    HintCase("the tenant's limit there is too small", FEWER, quotas=[quota("a", 0, 2, pool="q")]),
    HintCase(
        "the project's limit there is too small",
        FEWER,
        projects=[project_quota("a", "a", 0, 2, pool="q")],
    ),
    HintCase(
        "running work of the tenant there counts against its limit",
        FEWER,
        other=[node("m1", pool="q"), node("m2", pool="q")],
        running_now=[running(job("r", pool="q", gpus=6), ("m2", tuple(range(6))))],
    ),
    HintCase(
        "no GPU of an accepted model in the other pool",
        FEWER,
        job=job("j", gpus=4, models=("A100",)),
        other=[node("m1", pool="q", model="T4")],
    ),
    HintCase(
        "another model the workload accepts",
        "would start now in pool q",
        job=job("j", gpus=4, models=("A100", "T4")),
        other=[node("m1", pool="q", model="T4")],
    ),
    HintCase(
        "the other pool is full once this pass has placed its own work",
        FEWER,
        quotas=[quota("a", 0, 8, pool="q"), quota("b", 0, 8, pool="q")],
        also_pending=[job("k", "b", pool="q", gpus=6)],
    ),
    HintCase(
        "two replicas may share a node of the other pool",
        "would start now in pool q",
        job=job("j", gpus=4, replicas=2),
    ),
    HintCase(
        "a gang is never told to shrink",
        None,
        job=job("j", gpus=4, replicas=2),
        pools=[Pool("q", dedicated_tenant="b")],
    ),
]


@pytest.mark.parametrize("case", HINT_CASES, ids=[c.name for c in HINT_CASES])
def test_hint(case: HintCase) -> None:
    decisions = schedule(
        snapshot(
            [node("n1", gpus=2), *case.other],
            [quota("a", 0, 16), *case.quotas],
            [case.job, *case.also_pending],
            running_now=case.running_now,
            projects=case.projects,
            pools=[Pool("p"), *case.pools],
        )
    )
    assert set(decisions.placements) == {w.id for w in case.also_pending}
    assert decisions.waiting["j"].reason in (Reason.NO_CAPACITY_FOR_MODEL, Reason.GANG_CANNOT_FIT)
    assert decisions.waiting["j"].hint == case.hint


def test_fair_shares_are_reported_per_pool_and_tenant() -> None:
    decisions = schedule(snapshot([node("n1")], [quota("a", 2, 8), quota("b", 2, 8)], [job("j", gpus=8)]))
    assert decisions.fair_shares == {("p", "a"): 8.0, ("p", "b"): 0.0}


def test_same_snapshot_same_decisions() -> None:
    layout = snapshot(
        [node(f"n{i}", used=i % 5) for i in range(6)],
        BIG,
        [job(f"j{i}", "ab"[i % 2], gpus=1 + i % 4, at=i % 3) for i in range(30)],
    )
    assert schedule(layout) == schedule(layout)


def test_a_project_within_its_guarantee_reclaims_from_a_sibling_when_the_tenant_is_at_its_limit() -> None:
    from jobs.scheduler.core import (
        Gpu,
        Node,
        Pool,
        ProjectQuota,
        ReplicaAllocation,
        SchedulerConfig,
        Snapshot,
        TenantQuota,
        Workload,
        schedule,
    )

    gpus = tuple(Gpu(f"g{i}", i, "H100", True, False) for i in range(4))
    running = (
        Workload(
            "old", "t", "p1", "pool", 1.0, gpus=2, started_at=1.0, allocation=(ReplicaAllocation("n", ("g0", "g1")),)
        ),
        Workload(
            "new", "t", "p1", "pool", 2.0, gpus=2, started_at=2.0, allocation=(ReplicaAllocation("n", ("g2", "g3")),)
        ),
    )
    snapshot = Snapshot(
        now=1000.0,
        pools=(Pool("pool"),),
        nodes=(Node("n", "pool", 64000, 512000, 60000, 500000, gpus),),
        tenant_quotas=(TenantQuota("t", "pool", 4, 4),),
        project_quotas=(ProjectQuota("p1", "t", "pool", 2, 4), ProjectQuota("p2", "t", "pool", 2, 4)),
        running=running,
        pending=(Workload("claim", "t", "p2", "pool", 500.0, gpus=2),),
        config=SchedulerConfig(min_runtime_s=0),
    )
    decisions = schedule(snapshot)
    assert [(p.victim, p.reason.value) for p in decisions.preemptions] == [("new", "RECLAIM_GUARANTEE")]
    assert decisions.placements["claim"] == (ReplicaAllocation("n", ("g2", "g3")),)
