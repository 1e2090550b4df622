"""Every failing field of a submission at once, through the service, the API (single and bulk) and presets."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from jobs import services
from jobs.models import LaunchPreset, Workload
from jobs.services import presets
from jobs.services.spec import split_command
from tenants.context import Actor
from tests.conftest import World, client_for
from tests.jobs.factories import ready_world, request

pytestmark = pytest.mark.django_db

URL = "/api/v1/tenants/tenant-a/workloads/"
THREE_BAD = {"name": "Bad_Name!", "image": "UPPER CASE", "gpus_per_replica": -1}


def _body(**overrides: Any) -> dict[str, Any]:
    return {"project": "alpha", "pool": "shared", "name": "train", "image": "busybox:1.36", **overrides}


def _codes(response: Any) -> dict[str, str]:
    assert response.status_code == 400, response.content
    return {field: errors[0]["code"] for field, errors in response.json()["error"]["fields"].items()}


def test_the_service_names_every_failing_field_with_its_rule(world: World) -> None:
    ready_world(world)
    with pytest.raises(ValidationError) as caught:
        services.submit_workload(
            actor=Actor(user=world.member_a), project=world.project_a, data=request(world, **THREE_BAD)
        )
    codes = {field: errors[0].code for field, errors in caught.value.error_dict.items()}
    assert codes == {"name": "invalid_name", "image": "invalid_image", "gpus_per_replica": "out_of_range"}
    assert not Workload.all_tenants.exists()


def test_missing_unknown_and_invalid_fields_are_reported_together(world: World) -> None:
    ready_world(world)
    data = {"pool": world.pool, "gpus": 2, "replicas": 0, "command": ["ok", "bad\0"], "env": {"LD_PRELOAD": "/x"}}
    with pytest.raises(ValidationError) as caught:
        services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=data)
    codes = {field: errors[0].code for field, errors in caught.value.error_dict.items()}
    assert codes == {
        "gpus": "unknown_field",
        "name": "required",
        "image": "required",
        "replicas": "out_of_range",
        "command[1]": "invalid_value",
        "env.LD_PRELOAD": "forbidden_env",
    }


def test_the_api_answers_all_three_mistakes_at_once_and_writes_nothing(world: World) -> None:
    ready_world(world)
    response = client_for(world.member_a).post(URL, _body(**THREE_BAD), format="json")
    assert _codes(response) == {"name": "invalid_name", "image": "invalid_image", "gpus_per_replica": "out_of_range"}
    message = response.json()["error"]["message"]
    assert message.startswith("name: Use 1 to 63 lowercase letters")
    assert not Workload.all_tenants.exists()


def test_shape_errors_come_with_the_rules_the_other_fields_break(world: World) -> None:
    ready_world(world)
    body = _body(name="x" * 64, image="UPPER CASE", gpus_per_replica="two", replicas=0, pool="nowhere")
    response = client_for(world.member_a).post(URL, body, format="json")
    assert response.json()["error"]["fields"]["name"] == [{"code": "invalid", "message": "At most 63 characters."}]
    assert _codes(response) == {
        "name": "invalid",
        "gpus_per_replica": "invalid",
        "image": "invalid_image",
        "replicas": "out_of_range",
        "pool": "does_not_exist",
    }
    assert not Workload.all_tenants.exists()


def test_a_bulk_names_every_item_and_field_shape_and_rule_alike(world: World) -> None:
    ready_world(world)
    items: list[dict[str, Any]] = [
        {"name": "ok", "image": "busybox:1", "pool": "shared"},
        {"name": "Bad!", "image": "busybox:1", "pool": "shared", "replicas": "1"},
        {"name": "fine", "image": "UPPER", "pool": "shared", "gpus_per_replica": -1},
    ]
    response = client_for(world.member_a).post(f"{URL}bulk/", {"project": "alpha", "items": items}, format="json")
    assert _codes(response) == {
        "items[1].replicas": "invalid",
        "items[1].name": "invalid_name",
        "items[2].image": "invalid_image",
        "items[2].gpus_per_replica": "out_of_range",
    }
    valid_shape = [{**item, "replicas": 1} for item in items]
    response = client_for(world.member_a).post(f"{URL}bulk/", {"project": "alpha", "items": valid_shape}, format="json")
    assert set(_codes(response)) == {"items[1].name", "items[2].image", "items[2].gpus_per_replica"}
    assert not Workload.all_tenants.exists()


def test_the_api_takes_a_command_as_one_line_split_as_the_page_splits_it(world: World) -> None:
    ready_world(world)
    client = client_for(world.member_a)
    line = "python train.py --note 'two words' --lr 0.1"
    response = client.post(URL, _body(command=line), format="json")
    assert response.status_code == 201, response.content
    words = ["python", "train.py", "--note", "two words", "--lr", "0.1"]
    assert response.json()["command"] == split_command(line) == words
    listed = client.post(URL, _body(name="listed", command=["python", "train.py"]), format="json")
    assert listed.json()["command"] == ["python", "train.py"]
    unclosed = client.post(URL, _body(name="unclosed", command="python 'train.py", image="UPPER"), format="json")
    assert _codes(unclosed) == {"command": "invalid", "image": "invalid_image"}
    assert _codes(client.post(URL, _body(command={"a": 1}), format="json")) == {"command": "invalid"}
    assert _codes(client.post(URL, _body(command=["ok", 2]), format="json")) == {"command[1]": "invalid"}


def test_the_schema_documents_both_forms_of_a_command(world: World) -> None:
    schema = client_for(world.member_a).get("/api/v1/schema/?format=json").json()
    command = schema["components"]["schemas"]["WorkloadInputRequest"]["properties"]["command"]
    assert [form["type"] for form in command["oneOf"]] == ["array", "string"]
    assert "shell" in command["description"]


def test_a_preset_names_every_failing_field(world: World) -> None:
    ready_world(world)
    values = presets.PresetValues(
        name=" padded", image="UPPER", pool=world.pool, kind="job", replicas=0, idle_timeout_seconds=600
    )
    with pytest.raises(ValidationError) as caught:
        presets.create_preset(actor=Actor(user=world.admin_a), tenant=world.tenant_a, values=values)
    codes = {field: errors[0].code for field, errors in caught.value.error_dict.items()}
    assert codes == {
        "name": "invalid_name",
        "image": "invalid_image",
        "replicas": "out_of_range",
        "idle_timeout_seconds": "notebooks_only",
    }
    assert not LaunchPreset.all_tenants.exists()
