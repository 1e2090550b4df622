"""Volume services read through the scoped managers, under the tenant they name.

A person may belong to several tenants, with a home and projects in each;
the services are called from requests (the actor's tenant in scope), from
the controller's launch and from the CLI (no scope). Each enters the named
tenant's scope: it works with none active, keeps the caller's, and never
finds or changes another tenant's volumes.
"""

from __future__ import annotations

import pytest
from django.http import Http404

from inventory.choices import VolumeKind
from inventory.models import Volume, VolumeShare
from inventory.services import mounts
from inventory.services.volume_access import volume_rights
from inventory.services.volumes import create_volume, home_volume, share_volume, unshare_volume, update_volume
from tenants.models import Membership, Project
from tenants.scoping import active_tenant_id, tenant_scope
from tests.conftest import World, actor
from tests.jobs.factories import assign

pytestmark = pytest.mark.django_db


@pytest.fixture
def in_both(world: World) -> World:
    """member_a is also a member of tenant B, working in its project beta."""
    Membership.all_tenants.create(tenant=world.tenant_b, user=world.member_a, role="member")
    assign(world.member_a, world.project_b)
    return world


def test_a_home_is_the_named_tenants_with_no_scope_or_another_tenants_active(in_both: World) -> None:
    world = in_both
    theirs = home_volume(tenant=world.tenant_b, user=world.member_a)
    assert active_tenant_id() is None
    with tenant_scope(world.tenant_b):
        mine = home_volume(tenant=world.tenant_a, user=world.member_a)
        assert active_tenant_id() == world.tenant_b.pk, "the caller's scope comes back"
    assert (mine.tenant_id, theirs.tenant_id) == (world.tenant_a.pk, world.tenant_b.pk)
    assert home_volume(tenant=world.tenant_a, user=world.member_a).pk == mine.pk, "made once per tenant"
    assert Volume.all_tenants.filter(kind=VolumeKind.HOME, owner=world.member_a).count() == 2


def test_a_name_taken_in_another_tenant_is_free_in_this_one(world: World) -> None:
    create_volume(actor=actor(world.admin_b), tenant=world.tenant_b, kind=VolumeKind.DATASET, name="imagenet")
    mine = create_volume(actor=actor(world.admin_a), tenant=world.tenant_a, kind=VolumeKind.DATASET, name="imagenet")
    changed = update_volume(actor=actor(world.admin_a), volume=mine, description="ours")
    assert (changed.tenant_id, changed.description) == (world.tenant_a.pk, "ours")
    assert Volume.all_tenants.get(tenant=world.tenant_b).description == ""


def test_sharing_with_no_scope_active_touches_only_the_volumes_tenant(world: World) -> None:
    admin = actor(world.admin_a)
    gamma = Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    data = create_volume(actor=admin, tenant=world.tenant_a, kind=VolumeKind.DATASET, name="data", project=gamma)
    share = share_volume(actor=admin, volume=data, project=world.project_a)
    assert (share.tenant_id, share.read_only) == (world.tenant_a.pk, True)
    unshare_volume(actor=admin, volume=data, project=world.project_a)
    assert not VolumeShare.all_tenants.exists()
    assert active_tenant_id() is None


def test_a_workloads_mounts_are_its_tenants_volumes_alone(in_both: World) -> None:
    world = in_both
    create_volume(actor=actor(world.admin_b), tenant=world.tenant_b, kind=VolumeKind.DATASET, name="b-data")
    planned = mounts.plan_mounts(tenant=world.tenant_a, owner=world.member_a, project=world.project_a)
    assert {mount.volume.tenant_id for mount in planned} == {world.tenant_a.pk}
    assert [mount.target for mount in planned] == ["/home/member_a", "/projects/alpha"]


def test_a_volumes_rights_follow_the_actors_projects_in_its_own_tenant(in_both: World) -> None:
    world = in_both
    project = world.project_a
    alpha = create_volume(actor=actor(world.admin_a), tenant=world.tenant_a, kind="project", name="a", project=project)
    with tenant_scope(world.tenant_a):  # as the storage pages and API ask: the volume's shares are read in scope
        with pytest.raises(Http404):
            volume_rights(actor(world.member_a), alpha)  # beta, in tenant B, makes nobody a member of alpha
        assign(world.member_a, world.project_a)
        rights = volume_rights(actor(world.member_a), alpha)
    assert (rights.read, rights.write) == (True, True)


def test_a_volumes_shares_grant_rights_under_no_scope_or_another_tenants(in_both: World) -> None:
    world = in_both
    admin = actor(world.admin_a)
    gamma = Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    data = create_volume(actor=admin, tenant=world.tenant_a, kind="project", name="data", project=gamma)
    share_volume(actor=admin, volume=data, project=world.project_a, read_only=False)
    assign(world.member_a, world.project_a)
    fresh = Volume.all_tenants.get(pk=data.pk)  # no prefetched shares: they are read in the volume's own tenant
    rights = [volume_rights(actor(world.member_a), fresh)]
    with tenant_scope(world.tenant_b):
        rights.append(volume_rights(actor(world.member_a), Volume.all_tenants.get(pk=data.pk)))
        assert active_tenant_id() == world.tenant_b.pk
    assert [(r.read, r.write) for r in rights] == [(True, True), (True, True)]
