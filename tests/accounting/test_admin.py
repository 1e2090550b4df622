"""The accounting admin: operators read prices, budgets, requests and rollups there and change none of them."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounting.models import Budget, Price, RollupMark, UsageHour
from tests.accounting.budget_factories import request_world
from tests.conftest import PASSWORD, World


def _login(client: Client, username: str) -> None:
    assert client.login(username=username, password=PASSWORD)


def _rows(world: World) -> dict[str, int]:
    """One row of each accounting model, by admin URL name."""
    made = request_world(world)
    price = Price.objects.create(resource="gpu", amount_per_hour=Decimal("2"), effective_from=timezone.now())
    hour = UsageHour.all_tenants.create(
        tenant=world.tenant_a, project=world.project_a, owner=world.member_a, pool=world.pool, hour=timezone.now()
    )
    mark, _ = RollupMark.objects.get_or_create(pk=1)
    return {
        "price": price.pk,
        "budget": made["budget"],
        "increaserequest": made["pk"],
        "usagehour": hour.pk,
        "rollupmark": mark.pk,
    }


@pytest.mark.parametrize("model", ["price", "budget", "increaserequest", "usagehour", "rollupmark"])
def test_operators_read_every_accounting_model_and_can_change_none(world: World, client: Client, model: str) -> None:
    pk = _rows(world)[model]
    _login(client, "operator")
    assert client.get(reverse(f"admin:accounting_{model}_changelist")).status_code == 200
    assert client.get(reverse(f"admin:accounting_{model}_change", args=[pk])).status_code == 200
    assert client.get(reverse(f"admin:accounting_{model}_add")).status_code == 403
    assert client.post(reverse(f"admin:accounting_{model}_delete", args=[pk]), {"post": "yes"}).status_code == 403


def test_a_budget_posted_through_the_admin_is_not_changed(world: World, client: Client) -> None:
    pk = _rows(world)["budget"]
    _login(client, "operator")
    response = client.post(reverse("admin:accounting_budget_change", args=[pk]), {"amount": "1"})
    assert response.status_code == 403
    assert Budget.all_tenants.get(pk=pk).amount == Decimal(100)


def test_non_operators_cannot_read_the_accounting_admin(world: World, client: Client) -> None:
    _login(client, "admin_a")
    response = client.get(reverse("admin:accounting_budget_changelist"))
    assert response.status_code == 302 and "/login/" in response["Location"]
