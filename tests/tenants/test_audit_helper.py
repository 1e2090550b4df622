"""tenants.services.audit.update_audited: validate the changed fields, save only them, write one event."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction

from tenants.context import Actor
from tenants.models import AuditEvent, Membership, Project
from tenants.scoping import tenant_scope
from tenants.services.audit import JsonDict, update_audited
from tests.conftest import World

FIELDS = ["slug", "name", "description"]


def _update_project(world: World, changes: dict[str, Any]) -> Project:
    project = Project.all_tenants.get(pk=world.project_a.pk)
    return update_audited(
        actor=Actor(user=world.admin_a),
        action="project.update",
        obj=project,
        changes=changes,
        tenant_id=project.tenant_id,
        audited=FIELDS,
    )


def test_it_writes_the_changed_fields_and_one_event_with_the_snapshots_around_them(world: World) -> None:
    stamped = Project.all_tenants.get(pk=world.project_a.pk).updated_at
    project = _update_project(world, {"name": "Renamed", "description": "New"})
    stored = Project.all_tenants.get(pk=project.pk)
    assert (stored.name, stored.description) == ("Renamed", "New")
    assert stored.updated_at > stamped, "the auto_now fields are saved with the change"
    event = AuditEvent.all_tenants.get()
    assert (event.action, event.tenant_id, event.actor_id) == ("project.update", world.tenant_a.pk, world.admin_a.pk)
    assert (event.object_type, event.object_id) == ("project", str(project.pk))
    assert event.before == {"slug": "alpha", "name": "Alpha", "description": ""}
    assert event.after == {"slug": "alpha", "name": "Renamed", "description": "New"}


def test_it_saves_only_the_changed_fields(world: World) -> None:
    # Written behind the object's back: a save of every field would put the stale value back.
    Project.all_tenants.filter(pk=world.project_a.pk).update(description="written elsewhere")
    project = Project.all_tenants.get(pk=world.project_a.pk)
    project.description = "stale"
    update_audited(
        actor=Actor(user=world.admin_a),
        action="project.update",
        obj=project,
        changes={"name": "Renamed"},
        tenant_id=project.tenant_id,
        audited=FIELDS,
    )
    stored = Project.all_tenants.get(pk=project.pk)
    assert (stored.name, stored.description) == ("Renamed", "written elsewhere")


def test_bad_values_get_one_error_naming_every_failing_field_and_nothing_is_written(world: World) -> None:
    with pytest.raises(ValidationError) as raised:
        _update_project(world, {"slug": "Not A Slug", "name": ""})
    assert set(raised.value.message_dict) == {"slug", "name"}
    assert Project.all_tenants.get(pk=world.project_a.pk).name == "Alpha"
    assert not AuditEvent.all_tenants.exists()


def test_only_the_changed_fields_are_validated(world: World) -> None:
    Project.all_tenants.filter(pk=world.project_a.pk).update(slug="Not A Slug")
    assert _update_project(world, {"name": "Renamed"}).name == "Renamed"


def test_many_to_many_fields_are_set_and_a_snapshot_function_describes_the_object(world: World) -> None:
    membership = Membership.all_tenants.get(user=world.member_a)

    def described(m: Membership) -> JsonDict:
        return {"role": m.role, "projects": sorted(p.slug for p in m.projects.all())}

    with tenant_scope(world.tenant_a):
        update_audited(
            actor=Actor(user=world.admin_a),
            action="membership.update",
            obj=membership,
            changes={"role": "viewer", "projects": [world.project_a]},
            tenant_id=world.tenant_a.pk,
            audited=described,
        )
        stored = Membership.all_tenants.get(pk=membership.pk)
        assert stored.role == "viewer" and list(stored.projects.all()) == [world.project_a]
    event = AuditEvent.all_tenants.get()
    assert event.before == {"role": "member", "projects": []}
    assert event.after == {"role": "viewer", "projects": ["alpha"]}


def _update_then_fail(world: World) -> None:
    with transaction.atomic():
        _update_project(world, {"name": "Renamed"})
        raise RuntimeError("the caller fails after the update")


def test_the_change_and_its_event_roll_back_with_the_callers_transaction(world: World) -> None:
    with pytest.raises(RuntimeError):
        _update_then_fail(world)
    assert Project.all_tenants.get(pk=world.project_a.pk).name == "Alpha"
    assert not AuditEvent.all_tenants.exists()
