"""The quotas page: oversubscribed guarantees are said beside the quota and after saving; empty means no limit."""

from __future__ import annotations

from django.test import Client

from inventory.models import Gpu
from tenants.context import Actor
from tenants.models import NO_LIMIT, TenantQuota
from tests.conftest import PASSWORD, World
from tests.inventory.factories import make_node

QUOTAS = "/t/tenant-a/quotas/"


def _as(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=PASSWORD)
    return client


def test_a_guarantee_above_the_pools_gpus_is_said_to_each_as_far_as_they_may_see(world: World) -> None:
    """Tenant A is guaranteed 8 GPUs in a pool of 2; tenant B 3 more. Operators see the pool's whole
    promise, tenant A only its own."""
    make_node(Actor(user=world.operator), world.pool, name="n1", gpus=2)
    TenantQuota.all_tenants.create(tenant=world.tenant_b, pool=world.pool, guaranteed=3, limit=3)
    operator_page = _as("operator").get(QUOTAS).content.decode()
    assert "All tenants&#x27; guarantees in pool shared total 11 GPUs but the pool has 2 in service" in operator_page
    assert "oversubscribed by 9" in operator_page
    admin_page = _as("admin_a").get(QUOTAS).content.decode()
    assert "This tenant is guaranteed 8 GPUs in pool shared but the pool has 2 in service" in admin_page
    assert "All tenants" not in admin_page and "total 11" not in admin_page, "another tenant's guarantee stays its own"
    assert Gpu.objects.count() == 2


def test_saving_an_oversubscribed_quota_says_so_after_saving(world: World) -> None:
    response = _as("operator").post(
        f"{QUOTAS}tq/{world.quota_a.pk}/",
        {f"tq{world.quota_a.pk}-{k}": v for k, v in {"guaranteed": 8, "limit": "", "weight": 1}.items()},
        follow=True,
    )
    page = response.content.decode()
    assert "Quota saved." in page and 'class="flash-warning"' in page and "oversubscribed by 8" in page
    assert TenantQuota.all_tenants.get(pk=world.quota_a.pk).limit == NO_LIMIT


def test_the_limit_fields_start_empty_and_no_limit_shows_as_empty(world: World) -> None:
    TenantQuota.all_tenants.filter(pk=world.quota_a.pk).update(limit=NO_LIMIT)
    page = _as("operator").get(QUOTAS).content.decode()
    assert 'name="tq-limit"' in page and 'name="pq-limit"' in page
    for name in ("tq-limit", "pq-limit", f"tq{world.quota_a.pk}-limit"):
        field = page.split(f'name="{name}"')[1].split(">")[0]
        assert "value=" not in field, f"{name} starts empty: {field}"
    assert "<td>no limit</td>" in page
