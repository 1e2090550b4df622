"""Requests for more: who asks and decides, every rule at once, approval applies, expiry takes exactly it back."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.utils import timezone

from accounting.models import Budget, IncreaseRequest
from accounting.services import increases
from accounting.services.increases import Ask
from common.errors import Conflict
from tenants.context import Actor
from tenants.models import AuditEvent, ProjectQuota, TenantQuota
from tests.accounting.budget_factories import budget
from tests.conftest import World, client_for
from tests.jobs.factories import assign

pytestmark = pytest.mark.django_db


def _now() -> Any:
    return timezone.now()


def _budget_ask(**fields: Any) -> Ask:
    values: dict[str, Any] = {"kind": "budget", "reason": "paper deadline", "ends_at": _now() + timedelta(days=7),
                              "unit": "gpu_hours", "extra": "50"}  # fmt: skip
    return Ask(**{**values, **fields})


def _quota_ask(**fields: Any) -> Ask:
    values: dict[str, Any] = {"kind": "quota", "reason": "sweep", "ends_at": _now() + timedelta(days=7),
                              "pool": "shared", "guaranteed": 2, "limit": 6}  # fmt: skip
    return Ask(**{**values, **fields})


@pytest.fixture
def team(world: World) -> World:
    """Alpha has a 100 GPU-hour budget and a quota in `shared` (1 guaranteed, limit 4); member_a works in it."""
    budget(world.tenant_a, world.project_a, amount="100")
    ProjectQuota.all_tenants.create(tenant=world.tenant_a, project=world.project_a, pool=world.pool, guaranteed=1,
                                    limit=4)  # fmt: skip
    assign(world.member_a, world.project_a)
    return world


def _ask(world: World, ask: Ask, *, user: Any = None, project: Any = "alpha") -> IncreaseRequest:
    return increases.ask_for_more(
        actor=Actor(user=user or world.member_a),
        tenant=world.tenant_a,
        project=world.project_a if project == "alpha" else project,
        ask=ask,
        now=_now(),
    )


def _codes(error: ValidationError) -> dict[str, str]:
    return {name: found[0].code or "" for name, found in error.error_dict.items()}


# --- asking --------------------------------------------------------------------------------------------------


def test_a_member_of_the_project_asks_and_it_is_audited(team: World) -> None:
    asked = _ask(team, _budget_ask())
    assert (asked.state, asked.kind, asked.asked_extra, asked.requester) == ("pending", "budget", 50, team.member_a)
    assert asked.budget is not None and asked.budget.project == team.project_a
    assert AuditEvent.all_tenants.filter(action="increase_request.create", tenant_id=team.tenant_a.pk).exists()


def test_who_may_ask(team: World) -> None:
    with pytest.raises(PermissionDenied):
        _ask(team, _budget_ask(), user=team.viewer_a)
    with pytest.raises(Http404):
        _ask(team, _budget_ask(), user=team.admin_b)
    with pytest.raises(PermissionDenied):
        _ask(team, _budget_ask(), project=None)  # the tenant's own: its admins ask
    TenantQuota.all_tenants.filter(pk=team.quota_a.pk).update(guaranteed=8, limit=16)
    assert _ask(team, _quota_ask(guaranteed=10, limit=20), user=team.admin_a, project=None).project is None


def test_a_member_off_the_project_may_not_ask_for_it(world: World) -> None:
    budget(world.tenant_a, world.project_a)
    with pytest.raises(PermissionDenied):
        _ask(world, _budget_ask())


def test_every_broken_rule_is_named_at_once(team: World) -> None:
    with pytest.raises(ValidationError) as caught:
        _ask(team, _quota_ask(reason="  ", ends_at=_now() - timedelta(minutes=1), guaranteed=9, limit=3))
    assert _codes(caught.value) == {"reason": "required", "ends_at": "in_the_past", "limit": "limit_below_guaranteed"}
    with pytest.raises(ValidationError) as caught:
        _ask(team, _budget_ask(unit="money", extra="-1", ends_at=None))
    assert _codes(caught.value) == {"ends_at": "required", "extra": "invalid_amount", "unit": "no_budget"}
    with pytest.raises(ValidationError) as caught:
        _ask(team, _quota_ask(pool="nowhere", guaranteed=1, limit=4))
    assert _codes(caught.value) == {"pool": "not_found"}
    with pytest.raises(ValidationError) as caught:
        _ask(team, _quota_ask(guaranteed=1, limit=4))
    assert _codes(caught.value) == {"limit": "not_more"}
    assert not IncreaseRequest.all_tenants.exists()


# --- deciding ------------------------------------------------------------------------------------------------


def test_approving_a_budget_request_adds_the_extra_and_tells_the_requester(
    team: World, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    told: list[int] = []
    monkeypatch.setattr("accounting.services.increases.tell_requester", lambda request: told.append(request.pk))
    asked = _ask(team, _budget_ask())
    with django_capture_on_commit_callbacks(execute=True):
        approved = increases.approve_request(actor=Actor(user=team.admin_a), request=asked, now=_now(), note="ok")
    assert (approved.state, approved.decided_by, approved.decision_note) == ("approved", team.admin_a, "ok")
    assert (approved.previous, approved.granted) == ({"amount": "100.0000"}, {"amount": "150.0000"})
    assert Budget.all_tenants.get(project=team.project_a).amount == Decimal(150)
    assert told == [asked.pk]
    with pytest.raises(Conflict) as caught:
        increases.approve_request(actor=Actor(user=team.operator), request=asked, now=_now())
    assert caught.value.code == "request_not_pending"


def test_approving_a_quota_request_goes_through_the_quota_rules(team: World) -> None:
    asked = _ask(team, _quota_ask(guaranteed=2, limit=40))
    with pytest.raises(ValidationError) as caught:
        increases.approve_request(actor=Actor(user=team.admin_a), request=asked, now=_now())
    assert _codes(caught.value) == {"limit": "above_tenant_limit"}
    assert IncreaseRequest.all_tenants.get(pk=asked.pk).state == "pending", "nothing changed"
    fits = _ask(team, _quota_ask(guaranteed=2, limit=6))
    increases.approve_request(actor=Actor(user=team.admin_a), request=fits, now=_now())
    quota = ProjectQuota.all_tenants.get(project=team.project_a)
    assert (quota.guaranteed, quota.limit) == (2, 6)


def test_who_decides(team: World) -> None:
    asked = _ask(team, _budget_ask())
    with pytest.raises(PermissionDenied):
        increases.approve_request(actor=Actor(user=team.member_a), request=asked, now=_now())
    with pytest.raises(Http404):
        increases.refuse_request(actor=Actor(user=team.admin_b), request=asked, now=_now())
    TenantQuota.all_tenants.filter(pk=team.quota_a.pk).update(guaranteed=8, limit=16)
    own = _ask(team, _quota_ask(guaranteed=10, limit=20), user=team.admin_a, project=None)
    with pytest.raises(PermissionDenied):
        increases.approve_request(actor=Actor(user=team.admin_a), request=own, now=_now())
    decided = increases.approve_request(actor=Actor(user=team.operator), request=own, now=_now())
    assert (TenantQuota.all_tenants.get(pk=team.quota_a.pk).guaranteed, decided.state) == (10, "approved")


def test_refusing_and_cancelling(team: World) -> None:
    asked = _ask(team, _budget_ask())
    refused = increases.refuse_request(actor=Actor(user=team.admin_a), request=asked, now=_now(), note="not now")
    assert (refused.state, refused.decision_note, refused.previous) == ("refused", "not now", None)
    assert Budget.all_tenants.get(project=team.project_a).amount == Decimal(100)
    mine = _ask(team, _budget_ask())
    other = _ask(team, _budget_ask(), user=team.admin_a)
    with pytest.raises(PermissionDenied):
        increases.cancel_request(actor=Actor(user=team.member_a), request=other, now=_now())
    assert increases.cancel_request(actor=Actor(user=team.member_a), request=mine, now=_now()).state == "cancelled"
    with pytest.raises(Conflict):
        increases.cancel_request(actor=Actor(user=team.member_a), request=mine, now=_now())


def test_a_request_past_its_end_cannot_be_decided(team: World) -> None:
    asked = _ask(team, _budget_ask(ends_at=_now() + timedelta(hours=1)))
    with pytest.raises(Conflict) as caught:
        increases.approve_request(actor=Actor(user=team.admin_a), request=asked, now=_now() + timedelta(hours=2))
    assert caught.value.code == "request_ended"


# --- expiry --------------------------------------------------------------------------------------------------


def _approved(world: World, ask: Ask) -> IncreaseRequest:
    asked = _ask(world, ask)
    return increases.approve_request(actor=Actor(user=world.admin_a), request=asked, now=_now())


def test_expiry_restores_exactly_what_was_in_force_and_is_idempotent(team: World) -> None:
    granted = _approved(team, _budget_ask(ends_at=_now() + timedelta(hours=1)))
    quota = _approved(team, _quota_ask(ends_at=_now() + timedelta(hours=1)))
    pending = _ask(team, _budget_ask(ends_at=_now() + timedelta(hours=1)))
    assert increases.expire_requests(now=_now()) == 0, "not yet"
    later = _now() + timedelta(hours=2)
    assert increases.expire_requests(now=later) == 3
    assert Budget.all_tenants.get(project=team.project_a).amount == Decimal(100)
    restored = ProjectQuota.all_tenants.get(project=team.project_a)
    assert (restored.guaranteed, restored.limit) == (1, 4)
    states = dict(IncreaseRequest.all_tenants.values_list("pk", "state"))
    assert states == {granted.pk: "expired", quota.pk: "expired", pending.pk: "expired"}
    assert increases.expire_requests(now=later) == 0, "idempotent"
    assert Budget.all_tenants.get(project=team.project_a).amount == Decimal(100)
    assert AuditEvent.all_tenants.filter(action="increase_request.expire", actor_label="system").count() == 3


def test_expiry_takes_back_only_its_own_increase_when_another_was_granted_since(team: World) -> None:
    first = _approved(team, _budget_ask(extra="50", ends_at=_now() + timedelta(hours=1)))
    _approved(team, _budget_ask(extra="30", ends_at=_now() + timedelta(days=3)))
    assert Budget.all_tenants.get(project=team.project_a).amount == Decimal(180)
    increases.expire_requests(now=_now() + timedelta(hours=2))
    assert IncreaseRequest.all_tenants.get(pk=first.pk).state == "expired"
    assert Budget.all_tenants.get(project=team.project_a).amount == Decimal(130), "the later increase stays"
    increases.expire_requests(now=_now() + timedelta(days=4))
    assert Budget.all_tenants.get(project=team.project_a).amount == Decimal(100)


def test_a_tenant_quota_that_cannot_shrink_yet_keeps_its_increase_and_says_why(team: World) -> None:
    TenantQuota.all_tenants.filter(pk=team.quota_a.pk).update(guaranteed=8, limit=16)
    own = _ask(team, _quota_ask(guaranteed=8, limit=24, ends_at=_now() + timedelta(hours=1)), user=team.admin_a,
               project=None)  # fmt: skip
    increases.approve_request(actor=Actor(user=team.operator), request=own, now=_now())
    ProjectQuota.all_tenants.filter(project=team.project_a).update(limit=20)
    assert increases.expire_requests(now=_now() + timedelta(hours=2)) == 0
    stuck = IncreaseRequest.all_tenants.get(pk=own.pk)
    assert stuck.state == "approved" and "limit of 20" in stuck.expiry_problem
    ProjectQuota.all_tenants.filter(project=team.project_a).update(limit=10)
    assert increases.expire_requests(now=_now() + timedelta(hours=2)) == 1
    assert TenantQuota.all_tenants.get(pk=team.quota_a.pk).limit == 16


# --- the API, and tenant isolation ---------------------------------------------------------------------------


def test_the_api_asks_decides_and_hides_everything_from_other_tenants(team: World) -> None:
    base = "/api/v1/tenants/tenant-a/increase-requests/"
    body = {"kind": "budget", "project": "alpha", "unit": "gpu_hours", "extra": "25", "reason": "more",
            "ends_at": (_now() + timedelta(days=2)).isoformat()}  # fmt: skip
    made = client_for(team.member_a).post(base, body, format="json")
    assert made.status_code == 201, made.content
    pk = made.json()["id"]
    outsider = client_for(team.admin_b)
    assert outsider.get(f"{base}{pk}/").status_code == 404
    assert outsider.post(f"{base}{pk}/approve/", {}, format="json").status_code == 404
    assert outsider.get("/api/v1/tenants/tenant-b/increase-requests/").json()["results"] == []
    budget_id = Budget.all_tenants.get(project=team.project_a).pk
    assert outsider.get(f"/api/v1/tenants/tenant-a/budgets/{budget_id}/").status_code == 404
    assert outsider.get(f"/api/v1/tenants/tenant-b/budgets/{budget_id}/").status_code == 404
    assert (
        outsider.patch(f"/api/v1/tenants/tenant-b/budgets/{budget_id}/", {"amount": "1"}, format="json").status_code
        == 404
    )
    assert client_for(team.member_a).post(f"{base}{pk}/approve/", {}, format="json").status_code == 403
    approved = client_for(team.admin_a).post(f"{base}{pk}/approve/", {"note": "go"}, format="json")
    assert approved.status_code == 200 and approved.json()["state"] == "approved"
    listed = client_for(team.viewer_a).get("/api/v1/tenants/tenant-a/budgets/").json()["results"]
    assert [(b["project"], b["amount"], b["used"], b["remaining"]) for b in listed] == [
        ("alpha", "125.0000", "0.00", "125.00")
    ]


def test_the_api_names_every_bad_field(team: World) -> None:
    body = {"kind": "quota", "project": "alpha", "pool": "shared", "guaranteed": 9, "limit": 2, "reason": "",
            "ends_at": (_now() - timedelta(days=1)).isoformat()}  # fmt: skip
    answer = client_for(team.member_a).post("/api/v1/tenants/tenant-a/increase-requests/", body, format="json")
    assert answer.status_code == 400
    fields = answer.json()["error"]["fields"]
    assert set(fields) == {"reason", "ends_at", "limit"}


def test_the_requester_hears_of_the_decision(team: World, settings: Any) -> None:
    from notifications.models import Delivery, Notification

    settings.NOTIFICATIONS_EMAIL = True
    asked = _ask(team, _budget_ask())
    increases.refuse_request(actor=Actor(user=team.admin_a), request=asked, now=_now(), note="next month")
    notification = Notification.all_tenants.get(kind="request.decided")
    assert "refused" in notification.subject and "next month" in notification.body
    assert list(Delivery.all_tenants.values_list("user_id", flat=True)) == [team.member_a.pk]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_approvals_and_expiries_act_once(team: World) -> None:
    import threading

    from django.db import connections

    asked = _ask(team, _budget_ask(ends_at=_now() + timedelta(seconds=30)))
    barrier = threading.Barrier(3)
    outcomes: list[object] = []

    def approve() -> None:
        try:
            barrier.wait()
            outcomes.append(increases.approve_request(actor=Actor(user=team.admin_a), request=asked, now=_now()))
        except Conflict as error:
            outcomes.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=approve) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(type(o).__name__ for o in outcomes) == ["Conflict", "Conflict", "IncreaseRequest"]
    assert Budget.all_tenants.get(project=team.project_a).amount == Decimal(150), "applied once"
    expired: list[int] = []

    def expire() -> None:
        try:
            barrier.wait()
            expired.append(increases.expire_requests(now=_now() + timedelta(minutes=1)))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=expire) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(expired) == [0, 0, 1]
    assert Budget.all_tenants.get(project=team.project_a).amount == Decimal(100), "taken back once"
