"""Tenancy services read under the scope of the tenant they name, whatever scope their caller holds.

The same service serves the API (scoped to the URL's tenant), the CLI and
tasks (no scope), and operators acting on another tenant than the page's:
each case below runs with no scope active and with the other tenant's.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import pytest
from django.core.exceptions import ValidationError

from common.errors import Conflict
from tenants.models import AuditEvent, Membership, Project, ProjectQuota, Tenant
from tenants.scoping import active_tenant_id, tenant_id_scope, tenant_scope
from tenants.selectors import membership_role, oversubscribed_guarantees
from tenants.services import invitations, members, quotas, tenants
from tests.conftest import World, actor

CALLERS = ["no scope", "the other tenant's scope"]


@pytest.fixture(params=CALLERS)
def caller(request: pytest.FixtureRequest, world: World) -> Tenant | None:
    """The scope the caller holds: none (CLI, tasks), or the tenant other than the one the service names."""
    return None if request.param == "no scope" else world.tenant_a


def _held(scope: Tenant | None) -> AbstractContextManager[object]:
    return tenant_scope(scope) if scope is not None else nullcontext()


def test_tenant_id_scope_scopes_by_id_and_restores_the_previous_scope(world: World) -> None:
    with tenant_scope(world.tenant_a):
        with tenant_id_scope(world.tenant_b.pk):
            assert [p.slug for p in Project.objects.all()] == ["beta"]
        assert active_tenant_id() == world.tenant_a.pk
    assert active_tenant_id() is None


def test_a_project_slug_is_taken_only_in_its_own_tenant(world: World, caller: Tenant | None) -> None:
    with _held(caller):
        made = tenants.create_project(actor=actor(world.admin_b), tenant=world.tenant_b, slug="alpha", name="A")
        with pytest.raises(ValidationError) as error:
            tenants.create_project(actor=actor(world.admin_b), tenant=world.tenant_b, slug="beta", name="B")
        assert active_tenant_id() == (caller.pk if caller else None), "the caller's scope is back"
    assert made.tenant_id == world.tenant_b.pk
    assert error.value.error_dict["slug"][0].code == "unique"


def test_an_operator_changes_another_tenants_member_and_the_audit_shows_its_projects(
    world: World, caller: Tenant | None
) -> None:
    membership = Membership.all_tenants.get(tenant=world.tenant_b, user=world.admin_b)
    with _held(caller):
        members.update_member(actor=actor(world.operator), membership=membership, projects=[world.project_b])
    assert list(Membership.all_tenants.get(pk=membership.pk).projects(manager="all_tenants").all()) == [world.project_b]
    event = AuditEvent.all_tenants.get(action="membership.update")
    assert (event.tenant_id, event.after) == (world.tenant_b.pk, {**(event.after or {}), "projects": ["beta"]})


def test_the_last_admin_counts_only_its_own_tenants_admins(world: World) -> None:
    # Tenant B has an admin too; tenant A's only admin still cannot step down.
    membership = Membership.all_tenants.get(tenant=world.tenant_a, user=world.admin_a)
    with pytest.raises(Conflict) as error:
        members.update_member(actor=actor(world.admin_a), membership=membership, role="member")
    assert error.value.code == "last_admin"


def test_an_invitation_checks_only_the_named_tenants_members(world: World, caller: Tenant | None) -> None:
    # admin_a is a member of tenant A, not of B: B's admin may invite them, and not twice.
    with _held(caller):
        issued = invitations.invite_member(
            actor=actor(world.admin_b), tenant=world.tenant_b, username="admin_a", projects=["beta"]
        )
        with pytest.raises(ValidationError) as error:
            invitations.invite_member(actor=actor(world.admin_b), tenant=world.tenant_b, username="admin_a")
        with pytest.raises(ValidationError) as other:
            invitations.invite_member(
                actor=actor(world.admin_b), tenant=world.tenant_b, username="nobody", projects=["alpha"]
            )
    assert issued.invitation.tenant_id == world.tenant_b.pk
    assert error.value.error_dict["username"][0].code == "already_invited"
    assert other.value.error_dict["projects"][0].code == "does_not_exist", "another tenant's project is none"


def test_accepting_joins_the_inviting_tenant_only(world: World) -> None:
    issued = invitations.invite_member(
        actor=actor(world.admin_b), tenant=world.tenant_b, username="member_a", projects=["beta"]
    )
    secret = issued.link_path.rstrip("/").rsplit("/", 1)[-1]
    membership = invitations.accept_invitation(actor=actor(world.member_a), secret=secret)
    assert (membership.tenant_id, membership.role) == (world.tenant_b.pk, "member")
    assert Membership.all_tenants.filter(user=world.member_a).count() == 2, "tenant A's membership is untouched"
    assert membership_role(world.member_a, world.tenant_b) == "member"


def test_project_quotas_are_read_in_the_quotas_tenant(world: World, caller: Tenant | None) -> None:
    # Tenant B has no quota in the pool; tenant A's does not count for it.
    with _held(caller), pytest.raises(ValidationError) as error:
        quotas.create_project_quota(
            actor=actor(world.admin_b), project=world.project_b, pool=world.pool, values=quotas.QuotaValues(limit=1)
        )
    assert error.value.error_dict["pool"][0].code == "no_tenant_quota"
    with _held(caller):
        made = quotas.create_project_quota(
            actor=actor(world.admin_a), project=world.project_a, pool=world.pool, values=quotas.QuotaValues(limit=1)
        )
    assert ProjectQuota.all_tenants.get().pk == made.pk


def test_guarantees_are_a_tenants_own_and_the_pools_are_everyones(world: World) -> None:
    ProjectQuota.all_tenants.create(
        tenant=world.tenant_a, project=world.project_a, pool=world.pool, guaranteed=9, limit=9
    )
    values = quotas.QuotaValues(guaranteed=4, limit=4)
    quotas.create_tenant_quota(actor=actor(world.operator), tenant=world.tenant_b, pool=world.pool, values=values)
    with tenant_scope(world.tenant_b):
        found = oversubscribed_guarantees(world.tenant_a, {world.pool.pk: 10}, across_tenants=True)
    assert [(o.scope, o.guaranteed, o.backing) for o in found] == [("pool", 12, 10), ("tenant", 9, 8)]
