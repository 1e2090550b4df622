"""A new token starts with its owner's own role, so a member's first token can submit; never above the owner."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from jobs.models import Workload
from tenants import services
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import ApiToken
from tests.conftest import World, client_for
from tests.frontend.test_pages import logged_in
from tests.jobs.factories import ready_world
from tests.tenants.test_tokens import bearer

pytestmark = pytest.mark.django_db

TOKENS = "/api/v1/tokens/"


@pytest.mark.parametrize(
    ("user", "role"), [("viewer_a", Role.VIEWER), ("member_a", Role.MEMBER), ("admin_a", Role.ADMIN)]
)
def test_a_token_without_a_role_gets_the_owners_own(world: World, user: str, role: Role) -> None:
    issued = services.create_token(
        actor=Actor(user=getattr(world, user)), tenant=world.tenant_a, name="t", expires_in_days=30
    )
    assert issued.token.role == role


def test_an_operator_gets_an_admin_token_in_a_tenant_and_an_operator_token_without_one(world: World) -> None:
    operator = Actor(user=world.operator)
    in_tenant = services.create_token(actor=operator, tenant=world.tenant_a, name="t", expires_in_days=30)
    platform = services.create_token(actor=operator, tenant=None, name="p", expires_in_days=30)
    assert (in_tenant.token.role, platform.token.role) == (Role.ADMIN, Role.OPERATOR)


def test_a_members_first_api_token_submits_a_workload(world: World) -> None:
    ready_world(world)
    made = client_for(world.member_a).post(TOKENS, {"name": "ci", "tenant": "tenant-a"}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["role"] == "member"
    body = {"project": "alpha", "pool": "shared", "name": "first", "image": "busybox:1", "command": "echo hi"}
    submitted = bearer(made.json()["secret"]).post("/api/v1/tenants/tenant-a/workloads/", body, format="json")
    assert submitted.status_code == 201, submitted.content
    assert Workload.all_tenants.get(name="first").command == ["echo", "hi"]


def test_the_default_is_never_above_the_token_it_is_created_with(world: World) -> None:
    viewer_token = services.create_token(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, name="ro", role="viewer", expires_in_days=30
    )
    made = bearer(viewer_token.secret).post(TOKENS, {"name": "child", "tenant": "tenant-a"}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["role"] == "viewer"


def test_every_failing_field_of_a_token_is_named_at_once(world: World) -> None:
    with pytest.raises(ValidationError) as caught:
        services.create_token(
            actor=Actor(user=world.member_a), tenant=world.tenant_a, name=" ", role="admin", expires_in_days=0
        )
    codes = {field: errors[0].code for field, errors in caught.value.error_dict.items()}
    assert codes == {"name": "invalid", "expires_in_days": "out_of_range", "role": "above_own_role"}
    assert not ApiToken.all_tenants.exists()


def test_the_token_page_starts_at_the_owners_role_and_says_what_each_allows(world: World) -> None:
    client = logged_in("member_a")
    page = client.get("/t/tenant-a/tokens/").content.decode()
    assert '<option value="member" selected>Member: also launch workloads in your projects' in page
    assert "Viewer: read everything in the tenant; change nothing" in page
    assert 'value="admin"' not in page  # never above the owner's own role
    created = client.post("/t/tenant-a/tokens/", {"name": "ci", "role": "member", "expires_in_days": 90})
    assert created.status_code == 302
    assert ApiToken.all_tenants.get(name="ci").role == Role.MEMBER
