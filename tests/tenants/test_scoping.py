"""Fail-closed tenant scoping: no scope, no rows; a scope, only its rows; the request always ends unscoped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tenants.models import Project, ProjectQuota
from tenants.scoping import TenantScopeError, active_tenant_id, tenant_scope
from tests.conftest import World, client_for

UNSCOPED: list[tuple[str, Callable[[], Any]]] = [
    ("list", lambda: list(Project.objects.all())),
    ("count", lambda: Project.objects.count()),
    ("exists", lambda: Project.objects.exists()),
    ("get", lambda: Project.objects.get(slug="alpha")),
    ("first", lambda: Project.objects.first()),
    ("iterator", lambda: list(Project.objects.iterator())),
    ("update", lambda: Project.objects.update(name="x")),
    ("delete", lambda: Project.objects.all().delete()),
    ("create", lambda: Project.objects.create(slug="x", name="x")),
    ("aggregate", lambda: Project.objects.aggregate(n=__import__("django.db.models", fromlist=["Count"]).Count("id"))),
    ("values", lambda: list(Project.objects.values_list("slug", flat=True))),
]


@pytest.mark.parametrize("operation", [name for name, _ in UNSCOPED])
def test_default_manager_refuses_without_a_scope(world: World, operation: str) -> None:
    call = dict(UNSCOPED)[operation]
    with pytest.raises(TenantScopeError, match="no tenant scope active"):
        call()
    assert Project.all_tenants.count() == 2, "nothing was written"


def test_unscoped_queryset_used_as_a_subquery_matches_nothing(world: World) -> None:
    ProjectQuota.all_tenants.create(tenant=world.tenant_a, project=world.project_a, pool=world.pool, limit=1)
    assert not ProjectQuota.all_tenants.filter(project__in=Project.objects.all()).exists()


def test_scope_filters_to_its_tenant_and_nests(world: World) -> None:
    with tenant_scope(world.tenant_a):
        assert [p.slug for p in Project.objects.all()] == ["alpha"]
        assert Project.objects.filter(slug="beta").first() is None
        with tenant_scope(world.tenant_b):
            assert [p.slug for p in Project.objects.all()] == ["beta"]
        assert active_tenant_id() == world.tenant_a.pk
    assert active_tenant_id() is None


def test_scope_is_restored_after_an_exception(world: World) -> None:
    with pytest.raises(RuntimeError), tenant_scope(world.tenant_a):
        raise RuntimeError("boom")
    assert active_tenant_id() is None


@pytest.mark.parametrize(
    ("who", "url", "status"),
    [
        ("admin_a", "/api/v1/tenants/tenant-a/projects/", 200),
        ("admin_b", "/api/v1/tenants/tenant-a/projects/", 404),
        ("viewer_a", "/api/v1/tenants/tenant-a/audit-events/", 403),
        ("admin_a", "/api/v1/tenants/tenant-a/projects/nope/", 404),
    ],
)
def test_the_scope_never_outlives_a_request(world: World, who: str, url: str, status: int) -> None:
    assert client_for(getattr(world, who)).get(url).status_code == status
    assert active_tenant_id() is None


def test_the_scope_never_outlives_a_page(world: World, client: Any) -> None:
    from tests.conftest import PASSWORD

    assert client.login(username="admin_a", password=PASSWORD)
    assert client.get("/t/tenant-a/projects/").status_code == 200
    assert active_tenant_id() is None


def test_foreign_keys_in_input_resolve_through_the_scope(world: World) -> None:
    response = client_for(world.admin_a).post(
        "/api/v1/tenants/tenant-a/project-quotas/", {"project": "beta", "pool": "shared", "limit": 1}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["project"][0]["code"] == "does_not_exist"
    assert not ProjectQuota.all_tenants.exists()


def test_another_tenants_object_is_not_found_even_by_id(world: World) -> None:
    quota_b = ProjectQuota.all_tenants.create(tenant=world.tenant_b, project=world.project_b, pool=world.pool, limit=1)
    response = client_for(world.admin_a).get(f"/api/v1/tenants/tenant-a/project-quotas/{quota_b.pk}/")
    assert response.status_code == 404
    operator = client_for(world.operator).get(f"/api/v1/tenants/tenant-a/project-quotas/{quota_b.pk}/")
    assert operator.status_code == 404, "even an operator reaches an object only under its own tenant"
