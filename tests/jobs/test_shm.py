"""A workload's /dev/shm size (`shm_mib`): its rule at submission, presets, and the way to the Docker driver."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from common.protocol.messages import StartReplica
from inventory.agent.replicas import driver_spec
from inventory.drivers.docker import container_config
from inventory.models import Gpu
from jobs import services
from jobs.models import Workload
from jobs.services import presets
from jobs.services.execution import _placements, replica_spec
from jobs.services.presets import PresetValues
from tenants.context import Actor
from tests.conftest import World, client_for
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota, ready_world, request, run_pass_now

pytestmark = pytest.mark.django_db

URL = "/api/v1/tenants/tenant-a/workloads/"
PRESETS = "/api/v1/tenants/tenant-a/presets/"


def _job(**overrides: Any) -> dict[str, Any]:
    return {"project": "alpha", "pool": "shared", "name": "train", "image": "busybox:1", **overrides}


def _api_codes(response: Any) -> dict[str, str]:
    assert response.status_code == 400, response.content
    return {field: errors[0]["code"] for field, errors in response.json()["error"]["fields"].items()}


def _placeable_world(world: World) -> World:
    """Alpha has quota in `shared`, member_a works in alpha, and one 2-GPU node there has room for the memory."""
    give_quota(world)
    assign(world.member_a, world.project_a)
    node = make_node(Actor(user=world.operator), world.pool, name="n1", cpu_cores=64, memory_mib=512_000)
    Gpu.objects.bulk_create(Gpu(node=node, index=i, uuid=f"GPU-n1-{i}", model="H100") for i in range(2))
    return world


def _docker_shm_size(workload: Workload) -> int | None:
    """Return the ShmSize the Docker driver asks the engine for, from the start message the controller sends."""
    wire = StartReplica(spec=replica_spec(workload, 0, _placements(workload.pk))).to_wire()
    spec = driver_spec(StartReplica.from_wire(wire, version=StartReplica.VERSION).spec)
    config = container_config(spec, user="1000:1000", network="gpucloud-test")
    size: int | None = config["host_config"].get("ShmSize")
    return size


def test_a_submitted_shm_size_reaches_the_docker_drivers_request(world: World) -> None:
    _placeable_world(world)
    response = client_for(world.member_a).post(URL, _job(memory_mib=8192, shm_mib=4096), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["shm_mib"] == 4096
    run_pass_now()
    workload = Workload.all_tenants.get()
    assert workload.state == "scheduled", (workload.state, workload.reason_message)
    assert workload.shm_mib == 4096
    assert _docker_shm_size(workload) == 4096 * 1024 * 1024


def test_without_a_shm_size_the_runtime_keeps_its_default(world: World) -> None:
    _placeable_world(world)
    for body in (_job(), _job(name="nulled", shm_mib=None)):
        response = client_for(world.member_a).post(URL, body, format="json")
        assert response.status_code == 201, response.content
        assert response.json()["shm_mib"] is None
    run_pass_now()
    for workload in Workload.all_tenants.all():
        assert workload.state == "scheduled", (workload.state, workload.reason_message)
        assert workload.shm_mib is None
        assert _docker_shm_size(workload) is None  # the engine's own 64 MiB


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"shm_mib": -1}, "out_of_range"),
        ({"shm_mib": 0}, "out_of_range"),
        ({"shm_mib": "lots"}, "invalid"),
        ({"shm_mib": 1.5}, "invalid"),
        ({"shm_mib": 2048, "memory_mib": 1024}, "over_memory"),
        ({"shm_mib": 8192}, "over_memory"),  # over the default memory of 4096 MiB
    ],
)
def test_a_bad_shm_size_is_refused_naming_the_field_and_its_rule(
    world: World, fields: dict[str, Any], code: str
) -> None:
    ready_world(world)
    response = client_for(world.member_a).post(URL, _job(**fields), format="json")
    assert _api_codes(response) == {"shm_mib": code}
    if code == "over_memory":
        assert "memory_mib" in response.json()["error"]["fields"]["shm_mib"][0]["message"]
    assert not Workload.all_tenants.exists()


def test_every_failing_field_is_named_at_once(world: World) -> None:
    ready_world(world)
    member = client_for(world.member_a)
    response = member.post(URL, _job(name="Bad!", memory_mib=-1, shm_mib="lots"), format="json")
    assert _api_codes(response) == {"name": "invalid_name", "memory_mib": "out_of_range", "shm_mib": "invalid"}
    items = [
        {"name": "negative", "pool": "shared", "image": "busybox:1", "shm_mib": -1},
        {"name": "too-big", "pool": "shared", "image": "busybox:1", "memory_mib": 512, "shm_mib": 1024},
        {"name": "typed", "pool": "shared", "image": "busybox:1", "shm_mib": [64]},
        {"name": "fine", "pool": "shared", "image": "busybox:1", "shm_mib": 64},
    ]
    response = member.post(f"{URL}bulk/", {"project": "alpha", "items": items}, format="json")
    assert _api_codes(response) == {
        "items[0].shm_mib": "out_of_range",
        "items[1].shm_mib": "over_memory",
        "items[2].shm_mib": "invalid",
    }
    assert not Workload.all_tenants.exists()


def test_a_memory_that_could_not_be_read_does_not_make_the_shm_size_wrong(world: World) -> None:
    # 8192 MiB is over the default memory, but the memory sent is no number: only the memory is named.
    ready_world(world)
    response = client_for(world.member_a).post(URL, _job(memory_mib="lots", shm_mib=8192), format="json")
    assert _api_codes(response) == {"memory_mib": "invalid"}


def _preset_values(world: World, **overrides: Any) -> PresetValues:
    fields: dict[str, Any] = {"name": "DDP", "kind": "job", "image": "busybox:1", "pool": world.pool, **overrides}
    return PresetValues(**fields)


def test_a_preset_carries_its_shm_size_and_is_held_to_the_same_rule(world: World) -> None:
    ready_world(world)
    admin = Actor(user=world.admin_a)
    with pytest.raises(ValidationError) as caught:
        presets.create_preset(actor=admin, tenant=world.tenant_a, values=_preset_values(world, shm_mib=8192))
    assert [str(e.code) for e in caught.value.error_dict["shm_mib"]] == ["over_memory"]
    preset = presets.create_preset(
        actor=admin, tenant=world.tenant_a, values=_preset_values(world, memory_mib=16384, shm_mib=8192)
    )
    member = Actor(user=world.member_a)
    workload = services.submit_workload(actor=member, project=world.project_a, data={"name": "a", "preset": preset})
    assert (workload.memory_mib, workload.shm_mib) == (16384, 8192)
    # A submission that lowers the memory below the preset's shm size is told which field to change.
    with pytest.raises(ValidationError) as caught:
        services.submit_workload(
            actor=member, project=world.project_a, data={"name": "b", "preset": preset, "memory_mib": 4096}
        )
    assert list(caught.value.error_dict) == ["shm_mib"]
    smaller = {"name": "c", "preset": preset, "memory_mib": 4096, "shm_mib": 1024}
    assert services.submit_workload(actor=member, project=world.project_a, data=smaller).shm_mib == 1024


def test_the_preset_api_reads_and_writes_the_shm_size(world: World) -> None:
    ready_world(world)
    admin = client_for(world.admin_a)
    body = {"name": "DDP", "kind": "job", "image": "busybox:1", "pool": "shared", "shm_mib": 2048}
    created = admin.post(PRESETS, body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["shm_mib"] == 2048
    url = f"{PRESETS}{created.json()['id']}/"
    assert _api_codes(admin.patch(url, {"shm_mib": 5000}, format="json")) == {"shm_mib": "over_memory"}
    assert admin.patch(url, {"shm_mib": None}, format="json").json()["shm_mib"] is None


def test_the_service_input_takes_a_shm_size_like_the_api(world: World) -> None:
    ready_world(world)
    workload = services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, shm_mib=512)
    )
    assert workload.shm_mib == 512


def test_the_database_refuses_a_shm_size_over_the_memory(world: World) -> None:
    ready_world(world)
    workload = services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, memory_mib=1024)
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        Workload.all_tenants.filter(pk=workload.pk).update(shm_mib=2048)
    Workload.all_tenants.filter(pk=workload.pk).update(shm_mib=1024)
