"""Budgets: who sets them, their rules all at once, what is used of them, and how they hold work back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connection, transaction
from django.http import Http404
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounting.choices import HardAction, NoticeLevel
from accounting.models import Budget, Price
from accounting.periods import Period
from accounting.selectors import tenant_report
from accounting.selectors.budgets import budget_states, budgets_in_scope
from accounting.services import budgets
from accounting.services.notices import announce_budget_thresholds
from jobs import services
from jobs.choices import WorkloadState
from jobs.models import Allocation, Replica, Workload
from jobs.scheduler import shell
from jobs.scheduler.core import Reason
from jobs.services.execution import container_name
from tenants.context import Actor
from tenants.models import AuditEvent, Project
from tenants.scoping import tenant_scope
from tests.accounting.budget_factories import budget
from tests.accounting.factories import hold, workload
from tests.conftest import World
from tests.jobs.factories import add_node, ready_world, request

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 3, 1, tzinfo=UTC)
NOW = datetime(2026, 3, 10, tzinfo=UTC)


def _codes(error: ValidationError) -> dict[str, str]:
    return {name: found[0].code or "" for name, found in error.error_dict.items()}


def _window(**fields: Any) -> dict[str, Any]:
    """A fixed window around now: what service-level tests use, whatever the day of the month."""
    now = timezone.now()
    return {
        "period": "window",
        "window_start": now - timedelta(days=1),
        "window_end": now + timedelta(days=1),
        **fields,
    }


def _spend(world: World, project: Project, hours: float) -> None:
    """Record that `project` held one GPU for `hours` hours, ending a minute ago."""
    node = add_node(world, f"spent-{project.slug}", gpus=1)
    end = timezone.now() - timedelta(minutes=1)
    hold(workload(world, project, world.member_a), node, node.gpus.get(), end - timedelta(hours=hours), end)


# --- who sets what, and the rules ----------------------------------------------------------------------------


def test_admins_set_project_budgets_and_operators_the_tenants_own(world: World) -> None:
    mine = budgets.create_budget(actor=Actor(user=world.admin_a), tenant=world.tenant_a, project=world.project_a,
                                 amount="100")  # fmt: skip
    assert (mine.unit, mine.period, mine.soft_percent, mine.hard_action) == ("gpu_hours", "monthly", 80, "notify_only")
    event = AuditEvent.all_tenants.get(action="budget.create")
    assert event.tenant_id == world.tenant_a.pk and event.after is not None and event.after["project"] == "alpha"
    with pytest.raises(PermissionDenied):
        budgets.create_budget(actor=Actor(user=world.admin_a), tenant=world.tenant_a, amount="5")
    own = budgets.create_budget(actor=Actor(user=world.operator), tenant=world.tenant_a, amount="500", unit="money")
    assert own.project is None
    with pytest.raises(PermissionDenied):
        budgets.create_budget(actor=Actor(user=world.member_a), tenant=world.tenant_a, project=world.project_a,
                              amount="1", unit="money")  # fmt: skip
    with pytest.raises(PermissionDenied):
        budgets.update_budget(actor=Actor(user=world.admin_a), budget=own, changes={"amount": "600"})


def test_outsiders_get_404_and_another_tenants_project_is_not_found(world: World) -> None:
    with pytest.raises(Http404):
        budgets.create_budget(actor=Actor(user=world.admin_b), tenant=world.tenant_a, project=world.project_a,
                              amount="1")  # fmt: skip
    with pytest.raises(ValidationError) as caught:
        budgets.create_budget(actor=Actor(user=world.operator), tenant=world.tenant_a, project=world.project_b,
                              amount="1")  # fmt: skip
    assert _codes(caught.value) == {"project": "not_found"}


def test_every_broken_rule_is_named_at_once(world: World) -> None:
    with pytest.raises(ValidationError) as caught:
        budgets.create_budget(
            actor=Actor(user=world.admin_a), tenant=world.tenant_a, project=world.project_a, unit="coins",
            amount="-3", period="window", window_end=NOW, soft_percent=0, hard_action="explode",
        )  # fmt: skip
    assert _codes(caught.value) == {
        "unit": "invalid_choice",
        "amount": "invalid_amount",
        "window_start": "required",
        "soft_percent": "out_of_range",
        "hard_action": "invalid_choice",
    }
    assert not Budget.all_tenants.exists()


def test_one_budget_per_owner_and_unit(world: World) -> None:
    admin = Actor(user=world.admin_a)
    budgets.create_budget(actor=admin, tenant=world.tenant_a, project=world.project_a, amount="10")
    with pytest.raises(ValidationError) as caught:
        budgets.create_budget(actor=admin, tenant=world.tenant_a, project=world.project_a, amount="20")
    assert _codes(caught.value) == {"unit": "unique"}
    budgets.create_budget(actor=admin, tenant=world.tenant_a, project=world.project_a, amount="20", unit="money")


def test_an_update_keeps_owner_and_unit_and_judges_the_window(world: World) -> None:
    found = budget(world.tenant_a, world.project_a)
    with pytest.raises(ValidationError) as caught:
        budgets.update_budget(actor=Actor(user=world.admin_a), budget=found, changes={"unit": "money",
                              "period": "window", "window_start": NOW, "window_end": NOW})  # fmt: skip
    assert _codes(caught.value) == {"unit": "read_only", "window_end": "end_before_start"}
    changed = budgets.update_budget(actor=Actor(user=world.admin_a), budget=found,
                                    changes={"amount": Decimal("7.5"), "hard_action": "refuse_new"})  # fmt: skip
    assert (changed.amount, changed.hard_action) == (Decimal("7.5"), "refuse_new")
    assert AuditEvent.all_tenants.filter(action="budget.update").count() == 1
    budgets.delete_budget(actor=Actor(user=world.admin_a), budget=changed)
    assert not Budget.all_tenants.exists()


@pytest.mark.parametrize(
    "fields",
    [
        {"amount": Decimal(0)},
        {"soft_percent": 101},
        {"period": "window"},
        {"window_start": T0, "window_end": NOW},
        {"unit": "coins"},
        {"hard_action": "explode"},
    ],
    ids=["amount", "soft_percent", "window-missing", "monthly-with-window", "unit", "hard_action"],
)
def test_the_database_holds_the_single_row_rules(world: World, fields: dict[str, Any]) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        Budget.all_tenants.create(**{"tenant": world.tenant_a, "project": world.project_a, "amount": 1, **fields})


def test_the_database_refuses_a_second_tenant_budget_in_a_unit(world: World) -> None:
    budget(world.tenant_a)
    with pytest.raises(IntegrityError), transaction.atomic():
        budget(world.tenant_a)


# --- what is used --------------------------------------------------------------------------------------------


def test_use_is_the_usage_reports_own_figure_by_owner_and_unit(world: World) -> None:
    node = add_node(world, gpus=2)
    gpus = list(node.gpus.order_by("index"))
    gamma = Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    hold(
        workload(world, world.project_a, world.member_a),
        node,
        gpus[0],
        T0 + timedelta(hours=1),
        T0 + timedelta(hours=4),
    )
    hold(workload(world, gamma, world.member_a), node, gpus[1], T0 - timedelta(hours=2), T0 + timedelta(hours=2))
    hold(
        workload(world, world.project_b, world.admin_b), node, gpus[1], T0 + timedelta(hours=3), T0 + timedelta(hours=9)
    )
    Price.objects.create(resource="gpu", amount_per_hour=Decimal("2.5"), effective_from=T0 - timedelta(days=30))
    alpha = budget(world.tenant_a, world.project_a, amount="10")
    tenant_hours = budget(world.tenant_a, amount="4")
    tenant_money = budget(world.tenant_a, unit="money", amount="100")
    states = {s.budget.pk: s for s in budget_states(now=NOW)}
    assert states[alpha.pk].used == Decimal("3")
    assert states[tenant_hours.pk].used == Decimal("5"), "the tenant's own counts every project, this month only"
    assert states[tenant_money.pk].used == Decimal("12.5")
    report = tenant_report(world.tenant_a, Period("this-month", T0, datetime(2026, 4, 1, tzinfo=UTC)), [], now=NOW)
    assert states[tenant_hours.pk].used == Decimal(repr(report.total.gpu_hours)).quantize(Decimal("0.000001"))
    over = states[tenant_hours.pk]
    assert over.exhausted and over.remaining == 0 and over.level is NoticeLevel.CAP
    assert states[alpha.pk].remaining == Decimal(7) and states[alpha.pk].level is NoticeLevel.NONE


def test_a_window_counts_only_itself_and_holds_nothing_outside_it(world: World) -> None:
    node = add_node(world, gpus=1)
    hold(workload(world, world.project_a, world.member_a), node, node.gpus.get(), T0, T0 + timedelta(hours=10))
    later = budget(world.tenant_a, world.project_a, amount="1", period="window", hard_action="refuse_new",
                   window_start=T0 + timedelta(hours=8), window_end=T0 + timedelta(days=2))  # fmt: skip
    (state,) = budget_states(now=NOW)
    assert state.used == Decimal(2) and not state.in_force and not state.exhausted
    (inside,) = budget_states(now=T0 + timedelta(days=1))
    assert inside.in_force and inside.enforces(HardAction.REFUSE_NEW) and inside.budget == later


def test_states_of_many_budgets_take_a_fixed_number_of_queries(world: World) -> None:
    node = add_node(world, gpus=1)
    hold(workload(world, world.project_a, world.member_a), node, node.gpus.get(), T0, T0 + timedelta(hours=10))
    budget(world.tenant_a, world.project_a)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            budget_states(now=NOW)
        return len(captured.captured_queries)

    few = queries()
    budget(world.tenant_b, world.project_b)
    budget(world.tenant_a, unit="money")
    for index in range(5):
        project = Project.all_tenants.create(tenant=world.tenant_b, slug=f"p{index}", name=f"P{index}")
        budget(world.tenant_b, project, unit="money")
    assert queries() <= few + 1, "one report for every tenant instead of one tenant's"
    Budget.all_tenants.all().delete()
    assert queries() == 1, "no budget: one query"


# --- enforcement at submission and in a pass -----------------------------------------------------------------


def test_a_submission_beyond_a_refusing_budget_is_refused_with_every_other_error(world: World) -> None:
    ready_world(world)
    _spend(world, world.project_a, 3)
    budget(world.tenant_a, world.project_a, amount="2", hard_action="refuse_new", **_window())
    with pytest.raises(ValidationError) as caught:
        services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a,
                                 data=request(world, name="Bad Name!", gpus_per_replica=9))  # fmt: skip
    codes = _codes(caught.value)
    assert set(codes) == {"name", "gpus_per_replica", "project"} and codes["project"] == "budget_exhausted"
    message = caught.value.error_dict["project"][0].messages[0]
    assert "project alpha" in message and "3.00 used" in message
    assert not Workload.all_tenants.filter(name="Bad Name!").exists()


def test_a_tenants_own_budget_refuses_every_project_and_notify_only_refuses_none(world: World) -> None:
    ready_world(world)
    _spend(world, world.project_a, 3)
    own = budget(world.tenant_a, amount="1", hard_action="notify_only", **_window())
    member = Actor(user=world.member_a)
    assert services.submit_workload(actor=member, project=world.project_a, data=request(world)).pk
    Budget.all_tenants.filter(pk=own.pk).update(hard_action="stop_borrowing")
    with pytest.raises(ValidationError) as caught:
        services.submit_workload(actor=member, project=world.project_a, data=request(world, name="two"))
    assert _codes(caught.value) == {"project": "budget_exhausted"}


def test_another_tenants_budget_holds_nothing_of_this_one(world: World) -> None:
    ready_world(world)
    _spend(world, world.project_a, 3)
    budget(world.tenant_b, amount="1", hard_action="stop_running", **_window())
    assert services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))


def test_a_stop_running_budget_stops_running_work_in_a_real_pass(world: World) -> None:
    ready_world(world)
    node = add_node(world, "n2", gpus=2)
    started = timezone.now() - timedelta(hours=2)
    running = Workload.all_tenants.create(
        tenant=world.tenant_a, project=world.project_a, owner=world.member_a, name="train",
        image="registry.example.com/team/train:1.0", pool=world.pool, state=WorkloadState.RUNNING,
        started_at=started, scheduled_at=started,
    )  # fmt: skip
    Allocation.all_tenants.create(tenant=world.tenant_a, workload=running, replica=0, node=node,
                                  gpu=node.gpus.get(index=0), created_at=started)  # fmt: skip
    Replica.all_tenants.create(tenant=world.tenant_a, workload=running, attempt=1, index=0, node=node,
                               name=container_name(running.pk, 0, 1), state="running")  # fmt: skip
    waiting = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    budget(world.tenant_a, world.project_a, amount="1", hard_action="stop_running", **_window())
    result = shell.run_pass()
    assert result is not None and result.preempted == 1 and result.placed == 0
    stopped = Workload.all_tenants.get(pk=running.pk)
    assert (stopped.state, stopped.reason_code) == (WorkloadState.PREEMPTED, Reason.BUDGET)
    assert stopped.stop_requested_at is not None, "stopped by its node with its grace period"
    assert stopped.reason_message.startswith("Stopped: Project alpha's budget of 1 GPU-hours")
    held = Workload.all_tenants.get(pk=waiting.pk)
    assert (held.state, held.reason_code) == (WorkloadState.PENDING, Reason.BUDGET)
    assert "does not run until the budget is raised" in held.reason_message


def test_a_stop_borrowing_budget_keeps_new_work_within_the_guarantee_in_a_real_pass(world: World) -> None:
    ready_world(world)  # alpha: 0 guaranteed of its own quota, limit 8
    _spend(world, world.project_a, 3)
    budget(world.tenant_a, world.project_a, amount="1", hard_action="stop_borrowing", **_window())
    Budget.all_tenants.update(hard_action="notify_only")
    member = Actor(user=world.member_a)
    job = services.submit_workload(actor=member, project=world.project_a, data=request(world))
    Budget.all_tenants.update(hard_action="stop_borrowing")
    shell.run_pass()
    held = Workload.all_tenants.get(pk=job.pk)
    assert (held.state, held.reason_code) == (WorkloadState.PENDING, Reason.BUDGET)
    assert "guarantee of 0 GPUs in pool shared" in held.reason_message


# --- notices -------------------------------------------------------------------------------------------------


def test_each_threshold_is_announced_once_per_period(
    world: World, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    told: list[tuple[int, int]] = []
    monkeypatch.setattr(
        "accounting.services.notices.tell_threshold", lambda state, level: told.append((state.budget.pk, level))
    )
    node = add_node(world, gpus=1)
    work = workload(world, world.project_a, world.member_a)
    hold(work, node, node.gpus.get(), T0, T0 + timedelta(hours=9))
    found = budget(world.tenant_a, world.project_a, amount="10")
    with django_capture_on_commit_callbacks(execute=True):  # the announcement goes out once the claim commits
        assert announce_budget_thresholds(now=NOW) == 1
    assert told == [(found.pk, NoticeLevel.SOFT)]
    assert announce_budget_thresholds(now=NOW) == 0, "once per period"
    Allocation.all_tenants.update(released_at=T0 + timedelta(hours=11))
    with django_capture_on_commit_callbacks(execute=True):
        assert announce_budget_thresholds(now=NOW) == 1
    assert told[-1] == (found.pk, NoticeLevel.CAP)
    april = datetime(2026, 4, 2, tzinfo=UTC)
    assert announce_budget_thresholds(now=april) == 0, "a new month starts from nothing"
    Budget.all_tenants.filter(pk=found.pk).update(notified_level=NoticeLevel.CAP, notified_period_start=T0)
    Budget.all_tenants.filter(pk=found.pk).update(amount=100)
    announce_budget_thresholds(now=NOW)
    assert Budget.all_tenants.get(pk=found.pk).notified_level == NoticeLevel.NONE, "raised: a new crossing counts"


def test_the_budgets_selector_is_scoped(world: World) -> None:
    budget(world.tenant_a, world.project_a)
    budget(world.tenant_b, world.project_b)
    with tenant_scope(world.tenant_b):
        assert [b.project for b in budgets_in_scope()] == [world.project_b]


def test_the_tenants_admins_hear_of_a_threshold(world: World, settings: Any) -> None:
    from notifications.models import Delivery, Notification

    settings.NOTIFICATIONS_EMAIL = True
    node = add_node(world, gpus=1)
    hold(workload(world, world.project_a, world.member_a), node, node.gpus.get(), T0, T0 + timedelta(hours=12))
    budget(world.tenant_a, world.project_a, amount="10")
    assert announce_budget_thresholds(now=NOW) == 1
    notification = Notification.all_tenants.get()
    assert notification.kind == "budget.exhausted" and "project alpha (GPU-hours)" in notification.subject
    assert list(Delivery.all_tenants.values_list("user_id", flat=True)) == [world.admin_a.pk]
