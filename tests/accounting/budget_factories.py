"""Budgets and requests for more, ready for tests: a project budget, a tenant's own, a pending request."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from accounting.models import Budget
from accounting.services import increases
from tenants.context import Actor
from tenants.models import Project, ProjectQuota, Tenant
from tests.conftest import World
from tests.jobs.factories import assign


def budget(
    tenant: Tenant, project: Project | None = None, *, amount: str = "100", unit: str = "gpu_hours", **fields: Any
) -> Budget:
    """A monthly GPU-hour budget of `amount` (any field may be given), written directly."""
    return Budget.all_tenants.create(tenant=tenant, project=project, amount=Decimal(amount), unit=unit, **fields)


def budget_world(world: World) -> dict[str, Any]:
    """Alpha has a GPU-hour budget of 100; tenant A has a money budget of its own. Safe to run twice."""
    mine, _ = Budget.all_tenants.get_or_create(
        tenant=world.tenant_a, project=world.project_a, unit="gpu_hours", defaults={"amount": Decimal(100)}
    )
    own, _ = Budget.all_tenants.get_or_create(
        tenant=world.tenant_a, project=None, unit="money", defaults={"amount": Decimal(1000)}
    )
    return {"pk": mine.pk, "own": own.pk}


def request_world(world: World) -> dict[str, Any]:
    """`budget_world`, alpha's quota in `shared` (1 guaranteed, limit 2), member_a on alpha, and member_a's
    pending request for 10 more GPU-hours for a week."""
    extra = budget_world(world)
    ProjectQuota.all_tenants.get_or_create(
        tenant=world.tenant_a, project=world.project_a, pool=world.pool, defaults={"guaranteed": 1, "limit": 2}
    )
    assign(world.member_a, world.project_a)
    asked = increases.ask_for_more(
        actor=Actor(user=world.member_a),
        tenant=world.tenant_a,
        project=world.project_a,
        ask=increases.Ask(
            kind="budget", reason="deadline", ends_at=timezone.now() + timedelta(days=7), unit="gpu_hours", extra="10"
        ),
        now=timezone.now(),
    )
    return {**extra, "pk": asked.pk, "budget": extra["pk"]}


def ask_body(world: World, extra: dict[str, Any]) -> dict[str, Any]:
    """The API body of a quota request for alpha in `shared`: 2 guaranteed, limit 4, for a week."""
    ends = (timezone.now() + timedelta(days=7)).isoformat()
    return {
        "kind": "quota",
        "project": "alpha",
        "pool": "shared",
        "guaranteed": 2,
        "limit": 4,
        "reason": "x",
        "ends_at": ends,
    }
