"""Quota rules, through the API: each refusal names its field and rule, and writes nothing."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from inventory.models import NodePool
from tenants import services
from tenants.context import Actor
from tenants.models import NO_LIMIT, AuditEvent, Project, ProjectQuota, TenantQuota
from tests.conftest import World, client_for

PROJECT_QUOTAS = "/api/v1/tenants/tenant-a/project-quotas/"
TENANT_QUOTAS = "/api/v1/tenants/tenant-a/quotas/"


def _refused(response: Any, field: str, rule: str) -> None:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert field in error["message"]
    assert error["fields"][field][0]["code"] == rule, error


def _unchanged(before: tuple[int, int, int]) -> None:
    assert (ProjectQuota.all_tenants.count(), TenantQuota.all_tenants.count(), AuditEvent.all_tenants.count()) == before


def _counts() -> tuple[int, int, int]:
    return ProjectQuota.all_tenants.count(), TenantQuota.all_tenants.count(), AuditEvent.all_tenants.count()


def _post_project_quota(world: World, **numbers: Any) -> Any:
    body = {"project": "alpha", "pool": "shared", "guaranteed": 2, "limit": 4, **numbers}
    return client_for(world.admin_a).post(PROJECT_QUOTAS, body, format="json")


@pytest.mark.parametrize(
    ("numbers", "field", "rule"),
    [
        ({"guaranteed": 4, "limit": 2}, "limit", "limit_below_guaranteed"),
        ({"guaranteed": -1}, "guaranteed", "out_of_range"),
        ({"limit": 100_001}, "limit", "out_of_range"),
        ({"weight": 1_001}, "weight", "out_of_range"),
        ({"weight": -2}, "weight", "out_of_range"),
        ({"max_runtime_seconds": 5}, "max_runtime_seconds", "out_of_range"),
        ({"limit": 17}, "limit", "above_tenant_limit"),
        ({"guaranteed": "many"}, "guaranteed", "invalid"),
    ],
)
def test_impossible_project_quota_is_refused_naming_field_and_rule(
    world: World, numbers: dict[str, Any], field: str, rule: str
) -> None:
    before = _counts()
    _refused(_post_project_quota(world, **numbers), field, rule)
    _unchanged(before)


def test_projects_guarantees_above_the_tenants_are_saved_with_a_warning_saying_by_how_much(world: World) -> None:
    second = Project.all_tenants.create(tenant=world.tenant_a, slug="second", name="Second")
    first = _post_project_quota(world, guaranteed=5, limit=8)
    # The pool has no GPUs yet, which the tenant admin hears about too, for their own tenant's guarantee only.
    assert first.status_code == 201 and [w["scope"] for w in first.json()["warnings"]] == ["pool"]
    assert first.json()["warnings"][0]["message"].startswith("This tenant is guaranteed 8 GPUs in pool shared")
    response = client_for(world.admin_a).post(
        PROJECT_QUOTAS, {"project": second.slug, "pool": "shared", "guaranteed": 4, "limit": 4}, format="json"
    )
    assert response.status_code == 201, response.content
    [warning] = [w for w in response.json()["warnings"] if w["scope"] == "tenant"]
    assert (warning["scope"], warning["pool"], warning["guaranteed"], warning["available"], warning["excess"]) == (
        "tenant",
        "shared",
        9,
        8,
        1,
    )
    assert "oversubscribed by 1" in warning["message"]
    fixed = client_for(world.admin_a).patch(
        f"{PROJECT_QUOTAS}{response.json()['id']}/", {"guaranteed": 3}, format="json"
    )
    assert fixed.status_code == 200 and [w["scope"] for w in fixed.json()["warnings"]] == ["pool"]


def test_a_tenant_guarantee_above_the_pools_gpus_is_saved_with_a_warning(world: World) -> None:
    """The pool has no node at all: 8 guaranteed GPUs are 8 more than exist, and the operator hears so."""
    response = client_for(world.operator).patch(f"{TENANT_QUOTAS}{world.quota_a.pk}/", {"weight": 2}, format="json")
    assert response.status_code == 200
    [warning] = response.json()["warnings"]
    assert (warning["scope"], warning["guaranteed"], warning["available"], warning["excess"]) == ("pool", 8, 0, 8)
    assert "All tenants' guarantees in pool shared total 8 GPUs" in warning["message"]


def test_an_empty_limit_means_no_limit(world: World) -> None:
    """Left out or null, a limit is no limit: the API shows null and a project may then borrow up to the tenant's."""
    created = _post_project_quota(world, limit=None)
    assert created.status_code == 201, created.content
    assert created.json()["limit"] is None
    assert ProjectQuota.all_tenants.get(pk=created.json()["id"]).limit == NO_LIMIT
    # With a project unlimited, the tenant's own limit can still be lowered: nothing of the project's is above it.
    lowered = client_for(world.operator).patch(f"{TENANT_QUOTAS}{world.quota_a.pk}/", {"limit": 10}, format="json")
    assert lowered.status_code == 200 and lowered.json()["limit"] == 10
    unlimited = client_for(world.operator).patch(f"{TENANT_QUOTAS}{world.quota_a.pk}/", {"limit": None}, format="json")
    assert unlimited.json()["limit"] is None
    fresh = NodePool.objects.create(name="fresh")
    omitted = client_for(world.operator).post(TENANT_QUOTAS, {"pool": fresh.name, "guaranteed": 1}, format="json")
    assert omitted.status_code == 201 and omitted.json()["limit"] is None


def test_project_quota_needs_a_tenant_quota_in_the_pool(world: World) -> None:
    NodePool.objects.create(name="other")
    before = _counts()
    _refused(_post_project_quota(world, pool="other"), "pool", "no_tenant_quota")
    _unchanged(before)


def test_count_limits_stay_within_the_tenants(world: World) -> None:
    TenantQuota.all_tenants.filter(pk=world.quota_a.pk).update(max_pending_workloads=10, max_notebooks_per_user=2)
    before = _counts()
    _refused(_post_project_quota(world, max_pending_workloads=11), "max_pending_workloads", "above_tenant_limit")
    _refused(_post_project_quota(world, max_notebooks_per_user=3), "max_notebooks_per_user", "above_tenant_limit")
    _unchanged(before)
    assert _post_project_quota(world, max_pending_workloads=10, max_notebooks_per_user=1).status_code == 201


def test_happy_path_writes_one_quota_and_one_event(world: World) -> None:
    before = _counts()
    response = _post_project_quota(world, weight=3, max_runtime_seconds=3600)
    assert response.status_code == 201
    assert response.json()["project"] == "alpha" and response.json()["weight"] == 3
    assert _counts() == (before[0] + 1, before[1], before[2] + 1)
    quota_id = response.json()["id"]
    patched = client_for(world.admin_a).patch(f"{PROJECT_QUOTAS}{quota_id}/", {"limit": 16}, format="json")
    assert patched.status_code == 200 and patched.json()["limit"] == 16
    _refused(
        client_for(world.admin_a).patch(f"{PROJECT_QUOTAS}{quota_id}/", {"limit": 1}, format="json"),
        "limit",
        "limit_below_guaranteed",
    )
    assert ProjectQuota.all_tenants.get(pk=quota_id).limit == 16


def test_duplicate_project_quota_in_a_pool_is_refused(world: World) -> None:
    assert _post_project_quota(world).status_code == 201
    _refused(_post_project_quota(world), "pool", "unique")


def test_tenant_admin_cannot_change_their_tenants_quota(world: World) -> None:
    url = f"{TENANT_QUOTAS}{world.quota_a.pk}/"
    response = client_for(world.admin_a).patch(url, {"limit": 1000}, format="json")
    assert response.status_code == 403
    assert TenantQuota.all_tenants.get(pk=world.quota_a.pk).limit == 16
    assert (
        client_for(world.admin_a).post(TENANT_QUOTAS, {"pool": "shared", "limit": 5}, format="json").status_code == 403
    )


def test_operator_cannot_lower_the_tenants_limit_below_a_projects_but_may_its_guarantee(world: World) -> None:
    assert _post_project_quota(world, guaranteed=6, limit=12).status_code == 201
    url = f"{TENANT_QUOTAS}{world.quota_a.pk}/"
    operator = client_for(world.operator)
    before = _counts()
    _refused(operator.patch(url, {"guaranteed": 8, "limit": 11}, format="json"), "limit", "below_project_limit")
    _unchanged(before)
    lowered = operator.patch(url, {"guaranteed": 5, "limit": 12}, format="json")
    assert lowered.status_code == 200
    assert {(w["scope"], w["excess"]) for w in lowered.json()["warnings"]} == {("tenant", 1), ("pool", 5)}


def test_quota_in_a_pool_dedicated_to_another_tenant_is_refused(world: World) -> None:
    NodePool.objects.create(name="b-only", dedicated_tenant=world.tenant_b)
    response = client_for(world.operator).post(TENANT_QUOTAS, {"pool": "b-only", "limit": 4}, format="json")
    # The dedicated pool is not even a valid choice for tenant A.
    _refused(response, "pool", "does_not_exist")
    with pytest.raises(Exception, match="dedicated to another tenant"):
        services.create_tenant_quota(
            actor=Actor(user=world.operator),
            tenant=world.tenant_a,
            pool=NodePool.objects.get(name="b-only"),
            values=services.QuotaValues(limit=4),
        )


def test_deleting_a_tenant_quota_removes_its_projects_quotas_in_that_pool(world: World) -> None:
    assert _post_project_quota(world).status_code == 201
    assert client_for(world.operator).delete(f"{TENANT_QUOTAS}{world.quota_a.pk}/").status_code == 204
    assert not ProjectQuota.all_tenants.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_limit_changes_cannot_together_put_a_project_above_its_tenant(world: World) -> None:
    """The tenant's limit going down to 6 and a project's going up to 12 each pass alone; together they would
    leave the project above its tenant. The lock on the tenant's quota row lets one through."""
    quota = services.create_project_quota(
        actor=Actor(user=world.admin_a), project=world.project_a, pool=world.pool, values=services.QuotaValues(limit=4)
    )
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def run(change: Any) -> None:
        try:
            barrier.wait(timeout=10)
            change()
            outcomes.append("saved")
        except Exception as error:  # the loser's error is the point of the test
            outcomes.append(type(error).__name__)
        finally:
            connection.close()

    def lower_tenant() -> None:
        services.update_tenant_quota(actor=Actor(user=world.operator), quota=world.quota_a, changes={"limit": 6})

    def raise_project() -> None:
        services.update_project_quota(actor=Actor(user=world.admin_a), quota=quota, changes={"limit": 12})

    threads = [threading.Thread(target=run, args=(change,)) for change in (lower_tenant, raise_project)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["ValidationError", "saved"]
    tenant_limit = TenantQuota.all_tenants.get(pk=world.quota_a.pk).limit
    assert ProjectQuota.all_tenants.get(pk=quota.pk).limit <= tenant_limit


def _rules(response: Any) -> dict[str, str]:
    assert response.status_code == 400, response.content
    return {field: errors[0]["code"] for field, errors in response.json()["error"]["fields"].items()}


def test_every_broken_rule_of_a_project_quota_is_named_at_once(world: World) -> None:
    TenantQuota.all_tenants.filter(pk=world.quota_a.pk).update(max_pending_workloads=10)
    before = _counts()
    response = _post_project_quota(world, guaranteed=-1, limit=17, weight=5_000, max_pending_workloads=11)
    assert _rules(response) == {
        "guaranteed": "out_of_range",
        "limit": "above_tenant_limit",
        "weight": "out_of_range",
        "max_pending_workloads": "above_tenant_limit",
    }
    # A pool the serializer cannot find still leaves the numbers judged by the service's own rules.
    unknown_pool = _post_project_quota(world, pool="nowhere", guaranteed=-1, max_runtime_seconds=5)
    assert _rules(unknown_pool) == {
        "pool": "does_not_exist",
        "guaranteed": "out_of_range",
        "max_runtime_seconds": "out_of_range",
    }
    _unchanged(before)


def test_every_broken_rule_of_a_tenant_quota_change_is_named_at_once(world: World) -> None:
    assert _post_project_quota(world, guaranteed=2, limit=12, max_notebooks_per_user=3).status_code == 201
    url = f"{TENANT_QUOTAS}{world.quota_a.pk}/"
    before = _counts()
    response = client_for(world.operator).patch(
        url, {"limit": 11, "weight": -1, "max_notebooks_per_user": 2}, format="json"
    )
    assert _rules(response) == {
        "limit": "below_project_limit",
        "weight": "out_of_range",
        "max_notebooks_per_user": "below_project_limit",
    }
    wrong_type = client_for(world.operator).patch(url, {"limit": "lots", "guaranteed": -3}, format="json")
    assert _rules(wrong_type) == {"limit": "invalid", "guaranteed": "out_of_range"}
    _unchanged(before)
    assert TenantQuota.all_tenants.get(pk=world.quota_a.pk).limit == 16
