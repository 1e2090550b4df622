"""The budgets and requests pages, the launch page's budget line, and the queue's words for BUDGET."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from accounting.models import Budget, IncreaseRequest
from accounting.services import increases
from jobs.models import Workload
from tenants.context import Actor
from tests.accounting.budget_factories import budget, request_world
from tests.conftest import World
from tests.frontend.test_pages import logged_in
from tests.jobs.factories import ready_world


def test_members_read_budgets_and_admins_set_them(world: World) -> None:
    budget(world.tenant_a, world.project_a, amount="40")
    page = logged_in("member_a").get("/t/tenant-a/budgets/").content.decode()
    assert "0.0 of 40.0 GPU-hours" in page and "<progress" in page
    assert 'id="add-budget"' not in page and "Change or remove" not in page
    admin = logged_in("admin_a")
    assert 'id="add-budget"' in admin.get("/t/tenant-a/budgets/").content.decode()
    made = admin.post(
        "/t/tenant-a/budgets/",
        {"action": "budget", "project": "alpha", "unit": "money", "amount": "75", "period": "monthly",
         "soft_percent": "90", "hard_action": "refuse_new"},
    )  # fmt: skip
    assert made.status_code == 302
    assert Budget.all_tenants.filter(unit="money", amount=75, hard_action="refuse_new").exists()
    refused = admin.post("/t/tenant-a/budgets/", {"action": "budget", "project": "alpha", "unit": "money",
                                                  "amount": "5", "period": "monthly", "soft_percent": "0",
                                                  "hard_action": "notify_only"})  # fmt: skip
    assert refused.status_code == 200 and "Give a whole percentage from 1 to 100." in refused.content.decode()


def test_outsiders_get_404(world: World) -> None:
    budget(world.tenant_a, world.project_a)
    for path in ("/t/tenant-a/budgets/", "/t/tenant-a/requests/"):
        assert logged_in("admin_b").get(path).status_code == 404
    found = Budget.all_tenants.get()
    assert logged_in("admin_b").post(f"/t/tenant-a/budgets/{found.pk}/", {"action": "delete"}).status_code == 404
    assert Budget.all_tenants.exists()


def test_members_ask_and_admins_decide_on_the_requests_page(world: World) -> None:
    extra = request_world(world)
    member = logged_in("member_a")
    page = member.get("/t/tenant-a/requests/").content.decode()
    assert 'id="ask"' in page and ">Approve<" not in page and ">Withdraw<" in page
    ends = (timezone.now() + timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")
    asked = member.post("/t/tenant-a/requests/", {"action": "ask", "kind": "quota", "project": "alpha",
                                                   "pool": "shared", "guaranteed": "2", "limit": "4",
                                                   "reason": "sweep", "ends_at": ends})  # fmt: skip
    assert asked.status_code == 302, asked.content.decode()
    admin = logged_in("admin_a")
    assert ">Approve<" in admin.get("/t/tenant-a/requests/").content.decode()
    decided = admin.post(f"/t/tenant-a/requests/{extra['pk']}/approve/", {"note": "fine"}, follow=True)
    assert "Request approved." in decided.content.decode()
    assert IncreaseRequest.all_tenants.get(pk=extra["pk"]).state == "approved"
    again = admin.post(f"/t/tenant-a/requests/{extra['pk']}/refuse/", {}, follow=True)
    assert "only a pending one" in again.content.decode()


def test_the_launch_page_says_how_much_of_the_budget_a_job_may_use(world: World) -> None:
    ready_world(world)
    now = timezone.now()
    budget(world.tenant_a, world.project_a, amount="40", period="window", window_start=now - timedelta(days=1),
           window_end=now + timedelta(days=1))  # fmt: skip
    member = logged_in("member_a")
    page = member.get("/t/tenant-a/launch/").content.decode()
    assert "This job has no runtime limit: it may use all of your remaining 40.0 GPU-hours" in page
    body = {"kind": "job", "name": "Bad Name", "project": "alpha", "pool": "shared", "image": "x:1",
            "gpus_per_replica": "2", "replicas": "1", "cpu_milli": "1000", "memory_mib": "1024",
            "max_runtime_seconds": "7200", "priority_class": "normal"}  # fmt: skip
    refused = member.post("/t/tenant-a/launch/", body).content.decode()
    assert "This job may use up to 4.0 of your remaining 40.0 GPU-hours" in refused


def test_the_queue_names_the_budget_reason(world: World) -> None:
    ready_world(world)
    work = Workload.all_tenants.create(
        tenant=world.tenant_a, project=world.project_a, owner=world.member_a, name="held", image="x:1",
        pool=world.pool, reason_code="BUDGET", reason_message="Project alpha's budget is used up.",
    )  # fmt: skip
    page = logged_in("member_a").get("/t/tenant-a/queue/").content.decode()
    row = page.split(f'data-workload="{work.pk}"')[1].split("</tr>")[0]
    assert "Budget used up" in row and 'data-reason-code="BUDGET"' in row


def test_operators_see_every_tenants_own_pending_requests_in_one_place(world: World) -> None:
    """The operators' page lists tenants' requests for the tenant itself (which operators decide), not projects'
    (tenant admins decide those) nor decided ones; it links to where the decision is made; others get 404."""
    extra = request_world(world)  # member_a's pending request for project alpha
    ends = timezone.now() + timedelta(days=5)
    own = increases.ask_for_more(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, project=None,
        ask=increases.Ask(kind="budget", reason="quarter close", ends_at=ends, unit="money", extra="250"),
        now=timezone.now(),
    )  # fmt: skip
    decided = increases.ask_for_more(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, project=None,
        ask=increases.Ask(kind="budget", reason="old", ends_at=ends, unit="money", extra="5"),
        now=timezone.now(),
    )  # fmt: skip
    increases.cancel_request(actor=Actor(user=world.admin_a), request=decided, now=timezone.now())
    page = logged_in("operator").get("/ops/requests/").content.decode()
    assert f'data-request="{own.pk}" data-tenant="tenant-a"' in page and "quarter close" in page
    assert "250.0 more money" in page and 'href="/t/tenant-a/requests/#request-list"' in page
    assert f'data-request="{extra["pk"]}"' not in page and f'data-request="{decided.pk}"' not in page
    for who in ("admin_a", "member_a", "admin_b"):
        assert logged_in(who).get("/ops/requests/").status_code == 404
    assert "No tenant is waiting" not in page
    increases.refuse_request(actor=Actor(user=world.operator), request=own, now=timezone.now(), note="no")
    assert "No tenant is waiting" in logged_in("operator").get("/ops/requests/").content.decode()
