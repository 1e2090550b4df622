"""Budgets in the scheduler core, as tables: a layout, budget states and workloads in, expected decisions out."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from jobs.scheduler.core import (
    BudgetAction,
    BudgetState,
    Node,
    Ordering,
    ProjectQuota,
    Reason,
    SchedulerConfig,
    Snapshot,
    TenantQuota,
    Workload,
    WorkloadKind,
    schedule,
)
from jobs.scheduler.simulator.budgets import TenantBudget, parse_budget
from jobs.scheduler.simulator.build import POOL
from jobs.scheduler.simulator.engine import Settings as SimSettings
from jobs.scheduler.simulator.engine import simulate
from jobs.scheduler.simulator.traces import Trace, TraceJob, TraceNode
from tests.jobs.scheduler.layouts import job, node, project_quota, quota, running, snapshot

BORROW = BudgetAction.STOP_BORROWING
STOP = BudgetAction.STOP_RUNNING


def spent(
    tenant: str, project: str | None = None, action: BudgetAction = BORROW, *, used: float = 120.0
) -> BudgetState:
    """A budget of 100 GPU-hours this month with `used` GPU-hours used (120: used up)."""
    return BudgetState(tenant, project, action, used=used, amount=100.0)


@dataclass
class Case:
    """One row: the layout, the budgets, and what must be decided (id -> nodes; id -> reason)."""

    name: str
    nodes: list[Node]
    quotas: list[TenantQuota]
    budgets: list[BudgetState]
    pending: list[Workload] = field(default_factory=list)
    running_now: list[Workload] = field(default_factory=list)
    projects: list[ProjectQuota] = field(default_factory=list)
    placed: dict[str, list[str]] = field(default_factory=dict)
    waiting: dict[str, Reason] = field(default_factory=dict)
    preempted: dict[str, Reason] = field(default_factory=dict)
    config: SchedulerConfig | None = None


CASES = [
    Case(
        "stop_borrowing: work within the guarantee starts, work beyond it waits",
        [node("n1")],
        [quota("a", 2, 8)],
        [spent("a")],
        pending=[job("in", gpus=2), job("beyond", gpus=1, at=1)],
        placed={"in": ["n1"]},
        waiting={"beyond": Reason.BUDGET},
    ),
    Case(
        "stop_borrowing: what already runs above the guarantee keeps running",
        [node("n1", used=4)],
        [quota("a", 2, 8)],
        [spent("a")],
        running_now=[running(job("r", gpus=4), ("n1", (0, 1, 2, 3)))],
        pending=[job("more", gpus=1)],
        waiting={"more": Reason.BUDGET},
    ),
    Case(
        "a budget not used up holds nothing back",
        [node("n1")],
        [quota("a", 2, 8)],
        [spent("a", used=99.9)],
        pending=[job("big", gpus=6)],
        placed={"big": ["n1"]},
    ),
    Case(
        "notify_only and refuse_new are not the core's",
        [node("n1")],
        [quota("a", 0, 8)],
        [spent("a", action=BudgetAction.NOTIFY_ONLY), spent("a", "a", action=BudgetAction.REFUSE_NEW)],
        pending=[job("j", gpus=4)],
        placed={"j": ["n1"]},
    ),
    Case(
        "a project's budget holds back that project only, at its own guarantee",
        [node("n1")],
        [quota("a", 4, 8)],
        [spent("a", "x")],
        projects=[project_quota("x", "a", 1, 8), project_quota("y", "a", 1, 8)],
        pending=[job("x1", project="x"), job("x2", project="x", at=1), job("y1", project="y", gpus=3, at=2)],
        placed={"x1": ["n1"], "y1": ["n1"]},
        waiting={"x2": Reason.BUDGET},
    ),
    Case(
        "a tenant's own budget counts all its projects against the tenant's guarantee",
        [node("n1")],
        [quota("a", 2, 8), quota("b", 0, 8)],
        [spent("a")],
        projects=[project_quota("x", "a", 2, 8), project_quota("y", "a", 2, 8)],
        pending=[job("x1", project="x", gpus=2), job("y1", project="y", at=1), job("b1", "b", gpus=2, at=2)],
        placed={"x1": ["n1"], "b1": ["n1"]},
        waiting={"y1": Reason.BUDGET},
    ),
    Case(
        "stop_running: running work stops, pending work waits, CPU-only work too",
        [node("n1", used=2)],
        [quota("a", 4, 8), quota("b", 0, 8)],
        [spent("a", action=STOP)],
        running_now=[running(job("r", gpus=2), ("n1", (0, 1)), started=9_990.0)],
        pending=[job("p", gpus=1), job("cpu", gpus=0, cpu=1_000, at=1), job("b1", "b", at=2)],
        placed={"b1": ["n1"]},
        waiting={"p": Reason.BUDGET, "cpu": Reason.BUDGET},
        preempted={"r": Reason.BUDGET},
    ),
    Case(
        "stop_running stops notebooks and young work, even with preemption off",
        [node("n1", used=2)],
        [quota("a", 4, 8)],
        [spent("a", "a", action=STOP)],
        running_now=[running(job("nb", kind=WorkloadKind.NOTEBOOK, gpus=2), ("n1", (0, 1)), started=9_999.0)],
        preempted={"nb": Reason.BUDGET},
        config=SchedulerConfig(preemption=False),
    ),
    Case(
        "a stopped workload is never also a reclaim victim",
        [node("n1", gpus=4, used=4)],
        [quota("a", 0, 4), quota("b", 4, 4)],
        [spent("a", action=STOP)],
        running_now=[running(job("r", gpus=4), ("n1", (0, 1, 2, 3)))],
        pending=[job("b1", "b", gpus=4)],
        # b1 would reclaim r, but r is already stopping for its budget; its GPUs come free in a later pass.
        waiting={"b1": Reason.NO_CAPACITY},
        preempted={"r": Reason.BUDGET},
    ),
]


def _snapshot(case: Case) -> Snapshot:
    built = snapshot(
        case.nodes,
        case.quotas,
        case.pending,
        running_now=case.running_now,
        projects=case.projects,
        config=case.config,
    )
    return replace(built, budgets=tuple(case.budgets))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_layout(case: Case) -> None:
    decisions = schedule(_snapshot(case))
    placed = {wid: [r.node for r in replicas] for wid, replicas in decisions.placements.items()}
    assert placed == case.placed
    assert {wid: w.reason for wid, w in decisions.waiting.items()} == case.waiting
    assert {p.victim: p.reason for p in decisions.preemptions} == case.preempted


def test_the_sentence_names_the_budget_and_what_is_used() -> None:
    decisions = schedule(_snapshot(CASES[0]))
    assert decisions.waiting["beyond"].message == (
        "Tenant a's budget of 100 GPU-hours this month is used up (120.0 used): it may hold no more than its "
        "guarantee of 2 GPUs in pool p and holds 2; this workload asks for 1 GPU."
    )


def test_a_stop_says_which_budget_and_what_work_it_loses() -> None:
    case = CASES[6]
    decisions = schedule(_snapshot(case))
    (stop,) = decisions.preemptions
    assert stop.for_workload == ""
    assert stop.lost_gpu_seconds == 2 * (10_000.0 - 9_990.0)
    assert stop.detail.startswith("Tenant a's budget of 100 GPU-hours this month is used up (120.0 used)")
    assert decisions.waiting["p"].message.endswith(
        "its work does not run until the budget is raised or its period ends."
    )


def test_no_hint_points_to_a_pool_the_budget_holds_it_back_in() -> None:
    nodes = [node("n1", gpus=2, used=2), node("m1", pool="q")]
    quotas = [quota("a", 2, 8), quota("a", 0, 8, pool="q")]
    held = running(job("r", gpus=2), ("n1", (0, 1)))
    base = snapshot(nodes, quotas, [job("j", gpus=2)], running_now=[held])
    assert schedule(base).waiting["j"].hint == "would start now in pool q"
    budgeted = replace(base, budgets=(spent("a"),))
    waiting = schedule(budgeted).waiting["j"]
    assert waiting.reason is Reason.BUDGET and waiting.hint is None


def test_the_decisions_do_not_depend_on_the_order_of_running_work() -> None:
    case = CASES[6]
    forward = schedule(_snapshot(case))
    shuffled = replace(_snapshot(case), running=tuple(reversed(_snapshot(case).running)))
    assert schedule(shuffled) == forward


def test_the_most_severe_of_an_owners_used_up_budgets_applies() -> None:
    nodes = [node("n1", used=2)]
    held = running(job("r", gpus=2), ("n1", (0, 1)))
    both = (spent("a", action=BORROW), replace(spent("a", action=STOP), unit="USD"))
    decisions = schedule(replace(snapshot(nodes, [quota("a", 4, 8)], [], running_now=[held]), budgets=both))
    assert [p.victim for p in decisions.preemptions] == ["r"]


# --- the simulator -------------------------------------------------------------------------------------------
# One 8-GPU node; a and b are guaranteed 4 GPUs each. a runs a1 and a2 (4 GPUs, 7,200 s each) from 0 s on all
# 8 GPUs: a budget of 10 GPU-hours is used up at 4,500 s. a3 (4 GPUs, 3,600 s) arrives at 4,000 s and waits for
# room; a4 (the same) arrives at 5,000 s, once the budget is used up: every hard action above notify_only refuses it.

SIM_TENANTS = (TenantQuota("a", POOL, 4, 8, 4.0), TenantQuota("b", POOL, 4, 8, 4.0))
SIM_PROJECTS = tuple(ProjectQuota(q.tenant, q.tenant, POOL, q.guaranteed, q.limit, 1.0) for q in SIM_TENANTS)
SIM_TRACE = Trace(
    "budgets",
    (TraceNode("n0", 8, "V100", 64_000, 512_000),),
    (
        TraceJob("a1", "a", 0.0, 7_200.0, 4),
        TraceJob("a2", "a", 0.0, 7_200.0, 4),
        TraceJob("a3", "a", 4_000.0, 3_600.0, 4),
        TraceJob("a4", "a", 5_000.0, 3_600.0, 4),
    ),
)


def _simulate(*budgets: TenantBudget) -> dict[str, Any]:
    return simulate(SIM_TRACE, SimSettings(Ordering.FAIRSHARE, SIM_TENANTS, SIM_PROJECTS, budgets=budgets)).summary


def test_without_budgets_everything_runs_and_nothing_is_reported() -> None:
    summary = _simulate()
    assert summary["finished"] == 4 and "budgets" not in summary


def test_stop_borrowing_holds_new_work_to_the_guarantee_until_borrowed_work_ends() -> None:
    summary = _simulate(TenantBudget("a", 10.0))
    assert (summary["finished"], summary["unfinished"], summary["preemptions"]) == (3, 0, 0)
    # a3 waits for its budget from 4,500 s until a1 and a2 end at 7,200 s: 4 GPUs x 2,700 s.
    assert summary["budgets"]["held_back_gpu_hours"] == 3.0
    assert summary["budgets"]["jobs_held"] == 1 and summary["budgets"]["jobs_refused"] == 1
    assert summary["budgets"]["tenants"]["a"] == {"budget_gpu_hours": 10.0, "action": "stop_borrowing",
                                                  "used_gpu_hours": 20.0}  # fmt: skip


def test_stop_running_stops_work_when_the_budget_is_used_up_and_refuses_what_arrives_after() -> None:
    summary = _simulate(TenantBudget("a", 10.0, BudgetAction.STOP_RUNNING))
    budgets = summary["budgets"]
    assert (budgets["budget_preemptions"], budgets["jobs_refused"], budgets["jobs_held"]) == (2, 1, 3)
    assert budgets["tenants"]["a"]["used_gpu_hours"] == 10.0, "stopped exactly at the cap (8 GPUs x 4,500 s)"
    assert (summary["finished"], summary["unfinished"]) == (0, 3)


def test_a_budget_option_is_read_or_refused_with_its_reason() -> None:
    assert parse_budget("a=12.5") == TenantBudget("a", 12.5, BudgetAction.STOP_BORROWING)
    assert parse_budget("b=3:stop_running").action is BudgetAction.STOP_RUNNING
    for bad in ("a", "a=-1", "=3", "a=3:explode", "a=lots"):
        with pytest.raises(ValueError, match="--budget"):
            parse_budget(bad)
