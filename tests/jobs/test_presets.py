"""Launch presets: tenant admins write them, everyone in the tenant reads, submissions take defaults from them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404

from inventory.models import NodePool
from jobs import services
from jobs.models import LaunchPreset, Workload
from jobs.services import images, presets
from jobs.services.presets import PresetValues
from tenants.context import Actor
from tenants.models import AuditEvent
from tests.conftest import World, client_for
from tests.jobs.factories import ready_world, request

pytestmark = pytest.mark.django_db

PRESETS = "/api/v1/tenants/tenant-a/presets/"
WORKLOADS = "/api/v1/tenants/tenant-a/workloads/"


def _values(world: World, **overrides: Any) -> PresetValues:
    fields: dict[str, Any] = {
        "name": "PyTorch notebook",
        "image": "registry.local/jupyter:4",
        "pool": world.pool,
        "kind": "notebook",
        "gpus_per_replica": 2,
        "idle_timeout_seconds": 1800,
        "max_runtime_seconds": 7200,
        "command": ["start-notebook.sh"],
        **overrides,
    }
    return PresetValues(**fields)


def _preset(world: World, **overrides: Any) -> LaunchPreset:
    return presets.create_preset(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, values=_values(world, **overrides)
    )


def _refusal(call: Callable[[], object]) -> tuple[str, str]:
    with pytest.raises(ValidationError) as caught:
        call()
    field, errors = next(iter(caught.value.error_dict.items()))
    return field, str(errors[0].code)


def test_a_tenant_admin_creates_updates_and_deletes_with_audit(world: World) -> None:
    preset = _preset(world)
    assert (preset.tenant_id, preset.kind, preset.gpus_per_replica) == (world.tenant_a.pk, "notebook", 2)
    updated = presets.update_preset(actor=Actor(user=world.admin_a), preset=preset, changes={"replicas": 2})
    assert updated.replicas == 2
    presets.delete_preset(actor=Actor(user=world.admin_a), preset=updated)
    assert not LaunchPreset.all_tenants.exists()
    actions = list(AuditEvent.all_tenants.filter(tenant_id=world.tenant_a.pk).values_list("action", flat=True))
    assert sorted(a for a in actions if a.startswith("preset.")) == ["preset.create", "preset.delete", "preset.update"]


def test_members_cannot_write_presets_outsiders_do_not_see_the_tenant(world: World) -> None:
    with pytest.raises(PermissionDenied):
        presets.create_preset(actor=Actor(user=world.member_a), tenant=world.tenant_a, values=_values(world))
    with pytest.raises(Http404):
        presets.create_preset(actor=Actor(user=world.admin_b), tenant=world.tenant_a, values=_values(world))
    assert not LaunchPreset.all_tenants.exists()


@pytest.mark.parametrize(
    ("overrides", "field", "code"),
    [
        ({"name": ""}, "name", "invalid_name"),
        ({"name": " padded"}, "name", "invalid_name"),
        ({"description": "x" * 201}, "description", "too_long"),
        ({"kind": "daemon"}, "kind", "invalid_choice"),
        ({"image": "Not An Image"}, "image", "invalid_image"),
        ({"command": ["ok", 3]}, "command[1]", "invalid_value"),
        ({"gpus_per_replica": 65}, "gpus_per_replica", "out_of_range"),
        ({"replicas": 0}, "replicas", "out_of_range"),
        ({"max_runtime_seconds": 5}, "max_runtime_seconds", "out_of_range"),
        ({"kind": "job"}, "idle_timeout_seconds", "notebooks_only"),
        ({"idle_timeout_seconds": 10}, "idle_timeout_seconds", "out_of_range"),
        ({"gpus_per_replica": 9, "replicas": 2}, "gpus_per_replica", "above_quota_limit"),  # tenant limit 16
    ],
)
def test_field_rules(world: World, overrides: dict[str, Any], field: str, code: str) -> None:
    assert _refusal(lambda: _preset(world, **overrides)) == (field, code)
    assert not LaunchPreset.all_tenants.exists()


def test_the_pool_must_be_open_to_the_tenant_and_hold_its_quota(world: World) -> None:
    private = NodePool.objects.create(name="private", dedicated_tenant=world.tenant_b)
    assert _refusal(lambda: _preset(world, pool=private)) == ("pool", "does_not_exist")
    bare = NodePool.objects.create(name="bare")
    assert _refusal(lambda: _preset(world, pool=bare)) == ("pool", "no_quota")


def test_the_image_must_be_allowed_and_a_notebook_image_for_notebooks(world: World) -> None:
    operator = Actor(user=world.operator)
    images.create_allowed_image(actor=operator, pattern="registry.local/train:*", tenant=world.tenant_a)
    assert _refusal(lambda: _preset(world)) == ("image", "image_not_allowed")
    assert _refusal(lambda: _preset(world, image="registry.local/train:1")) == ("image", "not_a_notebook_image")
    job = _preset(world, image="registry.local/train:1", kind="job", idle_timeout_seconds=None)
    assert job.kind == "job"


def test_names_are_unique_in_a_tenant(world: World) -> None:
    _preset(world)
    assert _refusal(lambda: _preset(world)) == ("name", "unique")
    other = _preset(world, name="Other")
    change = {"name": "PyTorch notebook"}
    assert _refusal(lambda: presets.update_preset(actor=Actor(user=world.admin_a), preset=other, changes=change)) == (
        "name",
        "unique",
    )


def test_an_update_that_breaks_the_preset_is_refused_and_changes_nothing(world: World) -> None:
    preset = _preset(world)
    change = {"kind": "job"}  # a job with an idle timeout
    assert _refusal(lambda: presets.update_preset(actor=Actor(user=world.admin_a), preset=preset, changes=change)) == (
        "idle_timeout_seconds",
        "notebooks_only",
    )
    assert LaunchPreset.all_tenants.get().kind == "notebook"


# --- submitting from a preset -----------------------------------------------------------------


def test_a_submission_takes_the_presets_fields_and_records_it(world: World) -> None:
    ready_world(world)
    preset = _preset(world)
    workload = services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data={"name": "nb", "preset": preset}
    )
    assert (workload.kind, workload.image, workload.gpus_per_replica) == ("notebook", preset.image, 2)
    assert (workload.preset_id, workload.idle_timeout_seconds, workload.service_port) == (preset.pk, 1800, 8888)
    assert (workload.command, workload.max_runtime_seconds) == (["start-notebook.sh"], 7200)


def test_explicit_fields_override_the_preset_within_the_same_rules(world: World) -> None:
    ready_world(world)
    preset = _preset(world)
    actor = Actor(user=world.member_a)
    job = services.submit_workload(
        actor=actor, project=world.project_a, data={"name": "j", "preset": preset, "kind": "job", "gpus_per_replica": 1}
    )
    # A notebook preset launched as a batch job: no idle timeout, no Jupyter port.
    assert (job.kind, job.gpus_per_replica, job.idle_timeout_seconds, job.service_port) == ("job", 1, None, None)
    too_big = {"name": "big", "preset": preset, "gpus_per_replica": 9}
    assert _refusal(lambda: services.submit_workload(actor=actor, project=world.project_a, data=too_big)) == (
        "gpus_per_replica",
        "above_quota_limit",
    )
    assert _refusal(
        lambda: services.submit_workload(
            actor=actor, project=world.project_a, data={"name": "x", "preset": preset, "idle_timeout_seconds": 60}
        )
    ) == ("idle_timeout_seconds", "unknown_field")


def test_a_notebook_without_a_preset_gets_the_jupyter_port(world: World) -> None:
    ready_world(world)
    notebook = services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, kind="notebook")
    )
    assert (notebook.service_port, notebook.preset_id, notebook.idle_timeout_seconds) == (8888, None, None)


def test_another_tenants_preset_is_refused_by_the_service(world: World) -> None:
    ready_world(world)
    theirs = LaunchPreset.all_tenants.create(tenant=world.tenant_b, name="x", image="busybox:1", pool=world.pool)
    assert _refusal(
        lambda: services.submit_workload(
            actor=Actor(user=world.member_a), project=world.project_a, data={"name": "x", "preset": theirs}
        )
    ) == ("preset", "does_not_exist")


def test_a_replayed_key_with_the_same_preset_request_returns_the_first(world: World) -> None:
    ready_world(world)
    preset = _preset(world)
    actor = Actor(user=world.member_a)
    data = {"name": "nb", "preset": preset}
    first = services.submit(actor=actor, project=world.project_a, items=[data], idempotency_key="k")
    again = services.submit(actor=actor, project=world.project_a, items=[data], idempotency_key="k")
    assert (again.created, again.workloads[0].pk) == (False, first.workloads[0].pk)


# --- API ----------------------------------------------------------------------------------------


def _body(**overrides: Any) -> dict[str, Any]:
    return {"name": "Train", "kind": "job", "image": "busybox:1", "pool": "shared", "gpus_per_replica": 1, **overrides}


def test_api_admins_write_everyone_reads_outsiders_get_404(world: World) -> None:
    admin = client_for(world.admin_a)
    created = admin.post(PRESETS, _body(), format="json")
    assert created.status_code == 201, created.content
    url = f"{PRESETS}{created.json()['id']}/"
    assert client_for(world.viewer_a).get(url).json()["pool"] == "shared"
    assert client_for(world.member_a).post(PRESETS, _body(name="Mine"), format="json").status_code == 403
    assert client_for(world.admin_b).get(url).status_code == 404
    assert admin.patch(url, {"cpu_milli": 2000}, format="json").json()["cpu_milli"] == 2000
    bad = admin.patch(url, {"idle_timeout_seconds": 600}, format="json")
    assert bad.status_code == 400
    assert bad.json()["error"]["fields"]["idle_timeout_seconds"][0]["code"] == "notebooks_only"
    assert admin.post(PRESETS, _body(pool="nowhere"), format="json").status_code == 400
    assert admin.delete(url).status_code == 204


def test_api_submission_from_a_preset_and_bulk_resolves_presets_in_one_query(world: World) -> None:
    ready_world(world)
    preset = _preset(world)
    client = client_for(world.member_a)
    response = client.post(WORKLOADS, {"project": "alpha", "name": "nb", "preset": preset.pk}, format="json")
    assert response.status_code == 201, response.content
    assert (response.json()["kind"], response.json()["image"]) == ("notebook", preset.image)
    items = [{"name": f"j{i}", "preset": preset.pk, "kind": "job"} for i in range(3)]
    bulk = client.post(f"{WORKLOADS}bulk/", {"project": "alpha", "items": items}, format="json")
    assert bulk.status_code == 201, bulk.content
    missing = client.post(WORKLOADS, {"project": "alpha", "name": "nb", "preset": 999999}, format="json")
    assert missing.status_code == 400
    assert "preset" in missing.json()["error"]["fields"]
    theirs = LaunchPreset.all_tenants.create(tenant=world.tenant_b, name="x", image="busybox:1", pool=world.pool)
    foreign = client.post(WORKLOADS, {"project": "alpha", "name": "nb", "preset": theirs.pk}, format="json")
    assert foreign.status_code == 400
    assert Workload.all_tenants.count() == 4
