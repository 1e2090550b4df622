"""Budgets and requests for more are read in the tenant they name, whatever scope the caller holds.

Each case runs with no scope active (CLI, tasks) and with the other
tenant's, and tenant B holds rows like tenant A's that must stay unseen.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from accounting.models import Budget, IncreaseRequest
from accounting.services import budgets, increases
from tenants.context import Actor
from tenants.models import Tenant
from tenants.scoping import tenant_scope
from tests.accounting.budget_factories import budget, request_world
from tests.conftest import World


@pytest.fixture(params=["no scope", "the other tenant's scope"])
def caller(request: pytest.FixtureRequest, world: World) -> Tenant | None:
    """The scope the caller holds while the services name tenant A: none, or tenant B's."""
    return None if request.param == "no scope" else world.tenant_b


def _held(scope: Tenant | None) -> AbstractContextManager[object]:
    return tenant_scope(scope) if scope is not None else nullcontext()


def test_an_owner_has_one_budget_a_unit_in_its_own_tenant(world: World, caller: Tenant | None) -> None:
    budget(world.tenant_b, unit="money")
    operator = Actor(user=world.operator)
    with _held(caller):
        made = budgets.create_budget(actor=operator, tenant=world.tenant_a, unit="money", amount="50")
        with pytest.raises(ValidationError) as error:
            budgets.create_budget(actor=operator, tenant=world.tenant_a, unit="money", amount="60")
        budgets.update_budget(actor=operator, budget=made, changes={"amount": "70"})
    assert error.value.error_dict["unit"][0].code == "unique"
    assert sorted(Budget.all_tenants.values_list("tenant_id", "amount")) == sorted(
        [(world.tenant_a.pk, Decimal(70)), (world.tenant_b.pk, Decimal(100))]
    )


def test_asking_and_approving_touch_the_named_tenants_budget_only(world: World, caller: Tenant | None) -> None:
    theirs = budget(world.tenant_b, unit="money")
    extra = request_world(world)  # tenant A has its own money budget of 1000
    ends = timezone.now() + timedelta(days=7)
    with _held(caller):
        asked = increases.ask_for_more(
            actor=Actor(user=world.admin_a),
            tenant=world.tenant_a,
            project=None,
            ask=increases.Ask(kind="budget", reason="x", ends_at=ends, unit="money", extra="5"),
            now=timezone.now(),
        )
        approved = increases.approve_request(actor=Actor(user=world.operator), request=asked, now=timezone.now())
    assert asked.budget_id == extra["own"]
    assert IncreaseRequest.all_tenants.get(pk=approved.pk).state == "approved"
    assert Budget.all_tenants.get(pk=extra["own"]).amount == Decimal(1005)
    assert Budget.all_tenants.get(pk=theirs.pk).amount == Decimal(100), "tenant B's budget is untouched"
