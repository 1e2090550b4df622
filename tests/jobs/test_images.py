"""Allowed images: operators' patterns, what each tenant sees, and the submission rule (single and bulk)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from jobs import services
from jobs.models import AllowedImage, Workload, WorkloadEvent
from jobs.services import images
from tenants.context import Actor
from tenants.models import AuditEvent
from tests.conftest import World, client_for
from tests.jobs.factories import ready_world, request

pytestmark = pytest.mark.django_db

IMAGES = "/api/v1/images/"
TENANT_IMAGES = "/api/v1/tenants/tenant-a/images/"
WORKLOADS = "/api/v1/tenants/tenant-a/workloads/"


def _allow(world: World, pattern: str, tenant: Any = None, **fields: Any) -> AllowedImage:
    return images.create_allowed_image(actor=Actor(user=world.operator), pattern=pattern, tenant=tenant, **fields)


def _refusal(call: Callable[[], object]) -> tuple[str, str, str]:
    with pytest.raises(ValidationError) as caught:
        call()
    field, errors = next(iter(caught.value.error_dict.items()))
    return field, str(errors[0].code), errors[0].messages[0]


def _submit(world: World, **overrides: Any) -> Workload:
    return services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, **overrides)
    )


@pytest.mark.parametrize(
    "pattern",
    ["registry.local/pytorch:*", "registry.local/*", "*", "busybox:1.3?", "reg.io:5000/team/*/train:v*"],
)
def test_valid_patterns(pattern: str) -> None:
    assert images.check_pattern(pattern) == pattern


@pytest.mark.parametrize(
    "pattern", ["", "UPPER/case:*", "a b*", "registry.local/[ab]*", "registry.local//x", "x" * 256, "reg/x:*:*"]
)
def test_invalid_patterns_name_the_field_and_rule(pattern: str) -> None:
    assert _refusal(lambda: images.check_pattern(pattern))[:2] == ("pattern", "invalid_pattern")


def test_only_operators_manage_patterns_and_every_change_is_audited(world: World) -> None:
    with pytest.raises(PermissionDenied):
        images.create_allowed_image(actor=Actor(user=world.admin_a), pattern="busybox:*", tenant=world.tenant_a)
    image = _allow(world, "busybox:*", world.tenant_a, notebook=True, description="tiny")
    assert AuditEvent.all_tenants.filter(action="allowed_image.create", tenant_id=world.tenant_a.pk).count() == 1
    with pytest.raises(PermissionDenied):
        images.delete_allowed_image(actor=Actor(user=world.admin_a), image=image)
    images.delete_allowed_image(actor=Actor(user=world.operator), image=image)
    assert not AllowedImage.objects.exists()
    assert AuditEvent.all_tenants.filter(action="allowed_image.delete").count() == 1


def test_a_pattern_is_unique_per_tenant_and_platform_wide(world: World) -> None:
    _allow(world, "busybox:*", world.tenant_a)
    _allow(world, "busybox:*", world.tenant_b)
    _allow(world, "busybox:*")
    assert _refusal(lambda: _allow(world, "busybox:*", world.tenant_a))[:2] == ("pattern", "unique")
    assert _refusal(lambda: _allow(world, "busybox:*"))[:2] == ("pattern", "unique")
    assert AllowedImage.objects.count() == 3


def test_on_a_fresh_install_every_image_is_allowed(world: World) -> None:
    ready_world(world)
    assert _submit(world, image="anything.example/x:1", kind="notebook").image == "anything.example/x:1"


def test_once_any_pattern_exists_the_list_applies_even_to_tenants_without_one(world: World) -> None:
    ready_world(world)
    _allow(world, "registry.local/*", world.tenant_b)  # tenant B's pattern switches the allow-list on for all
    field, code, message = _refusal(lambda: _submit(world, image="registry.local/x:1"))
    assert (field, code) == ("image", "image_not_allowed")
    assert "registry.local/x:1" in message
    assert not Workload.all_tenants.exists()


def test_own_and_platform_wide_patterns_allow_and_notebooks_need_a_notebook_image(world: World) -> None:
    ready_world(world)
    _allow(world, "registry.local/pytorch:*", world.tenant_a)
    _allow(world, "registry.local/jupyter:*", notebook=True)
    assert _submit(world, image="registry.local/pytorch:2.4").image == "registry.local/pytorch:2.4"
    assert _submit(world, image="registry.local/jupyter:4", kind="notebook").kind == "notebook"
    assert _refusal(lambda: _submit(world, image="registry.local/pytorch:2.4", kind="notebook"))[:2] == (
        "image",
        "not_a_notebook_image",
    )
    assert _refusal(lambda: _submit(world, image="registry.local/tensorflow:2"))[1] == "image_not_allowed"
    assert _refusal(lambda: _submit(world, image="registry.local/pytorch"))[1] == "image_not_allowed"


def test_bulk_refusal_names_the_item_in_one_query(world: World, django_assert_max_num_queries: Any) -> None:
    ready_world(world)
    _allow(world, "registry.example.com/team/*", world.tenant_a)
    items = [request(world, name=f"job-{i}") for i in range(50)]
    items[7] = request(world, name="job-7", image="docker.io/evil:1")
    with django_assert_max_num_queries(12):
        field, code, _ = _refusal(
            lambda: services.submit_workloads(actor=Actor(user=world.member_a), project=world.project_a, items=items)
        )
    assert (field, code) == ("items[7].image", "image_not_allowed")
    assert not Workload.all_tenants.exists()
    assert not WorkloadEvent.all_tenants.exists()


def test_the_policy_reads_in_one_query(world: World, django_assert_num_queries: Any) -> None:
    _allow(world, "a/*", world.tenant_b)
    _allow(world, "b/*", world.tenant_a, notebook=True)
    _allow(world, "c/*")
    with django_assert_num_queries(1):
        policy = images.policy_for_tenant(world.tenant_a.pk)
    assert policy.enforced
    assert sorted(policy.patterns) == [("b/*", True), ("c/*", False)]


# --- API ------------------------------------------------------------------------------------


def test_operators_manage_patterns_through_the_api(world: World) -> None:
    operator = client_for(world.operator)
    created = operator.post(IMAGES, {"pattern": "registry.local/*", "tenant": "tenant-a"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["tenant"] == "tenant-a"
    wide = operator.post(IMAGES, {"pattern": "busybox:*", "notebook": True}, format="json")
    assert (wide.status_code, wide.json()["tenant"]) == (201, None)
    bad = operator.post(IMAGES, {"pattern": "Bad Pattern"}, format="json")
    assert bad.status_code == 400
    assert bad.json()["error"]["fields"]["pattern"][0]["code"] == "invalid_pattern"
    assert [row["pattern"] for row in operator.get(IMAGES).json()["results"]] == ["busybox:*", "registry.local/*"]
    assert operator.delete(f"{IMAGES}{created.json()['id']}/").status_code == 204
    assert AllowedImage.objects.count() == 1


def test_tenant_users_see_their_patterns_and_platform_wide_ones_never_another_tenants(world: World) -> None:
    _allow(world, "a/*", world.tenant_a)
    _allow(world, "b/*", world.tenant_b)
    _allow(world, "c/*")
    seen = client_for(world.viewer_a).get(TENANT_IMAGES).json()["results"]
    assert sorted(row["pattern"] for row in seen) == ["a/*", "c/*"]
    assert client_for(world.admin_b).get(TENANT_IMAGES).status_code == 404
    assert client_for(world.admin_a).get(IMAGES).status_code == 403


def test_the_api_refusal_is_a_400_naming_image(world: World) -> None:
    ready_world(world)
    _allow(world, "registry.local/*", world.tenant_a)
    body = {"project": "alpha", "pool": "shared", "name": "train", "image": "busybox:1"}
    response = client_for(world.member_a).post(WORKLOADS, body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["image"][0]["code"] == "image_not_allowed"
    assert not Workload.all_tenants.exists()
