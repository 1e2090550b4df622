"""Field rules and the rules that read the database, answered together: one round names every failing field."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from jobs import services
from jobs.models import AllowedImage, Workload, WorkloadEvent
from jobs.services import images
from jobs.services.submission import submission_errors
from tenants.context import Actor
from tenants.models import AuditEvent, Project
from tests.conftest import World, client_for
from tests.jobs.factories import add_node, assign, give_quota, request

pytestmark = pytest.mark.django_db

URL = "/api/v1/tenants/tenant-a/workloads/"
ALLOWED = "registry.example.com/team/*"
# A bad name (its own rule), an image off the allow-list and more GPUs than the project's limit of 2 (the database's).
THREE_BAD = {"name": "Bad_Name!", "image": "docker.io/evil:1", "gpus_per_replica": 4}
THREE_CODES = {"name": "invalid_name", "image": "image_not_allowed", "gpus_per_replica": "above_quota_limit"}


@pytest.fixture
def team(world: World) -> World:
    """Alpha may hold 2 GPUs in `shared` (one ready 8-GPU node there), member_a is on it, the allow-list is on."""
    give_quota(world, limit=2, max_runtime_seconds=3600)
    add_node(world)
    assign(world.member_a, world.project_a)
    allow(world)
    return world


def allow(world: World) -> AllowedImage:
    return images.create_allowed_image(actor=Actor(user=world.operator), pattern=ALLOWED, tenant=world.tenant_a)


def _codes(error: ValidationError) -> dict[str, str]:
    return {field: str(errors[0].code) for field, errors in error.error_dict.items()}


def _api_codes(response: Any) -> dict[str, str]:
    assert response.status_code == 400, response.content
    return {field: errors[0]["code"] for field, errors in response.json()["error"]["fields"].items()}


def _nothing_written() -> None:
    assert not Workload.all_tenants.exists()
    assert not WorkloadEvent.all_tenants.exists()
    assert not AuditEvent.all_tenants.filter(action="workload.submit").exists()


def _submit(world: World, **overrides: Any) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        services.submit_workload(
            actor=Actor(user=world.member_a), project=world.project_a, data=request(world, **overrides)
        )
    return caught.value


def test_the_service_answers_a_field_rule_and_the_database_rules_together(team: World) -> None:
    assert _codes(_submit(team, **THREE_BAD)) == THREE_CODES
    _nothing_written()


def test_a_field_that_breaks_its_own_rule_is_not_judged_by_the_database_rules(team: World) -> None:
    # An image that is no reference at all is not also "not allowed"; -1 GPUs is not also "above the limit".
    error = _submit(team, image="UPPER CASE", gpus_per_replica=-1, max_runtime_seconds=7200)
    assert _codes(error) == {
        "image": "invalid_image",
        "gpus_per_replica": "out_of_range",
        "max_runtime_seconds": "above_max_runtime",
    }
    assert [e.code for e in error.error_dict["image"]] == ["invalid_image"]


def test_a_broken_field_stands_in_leniently_so_no_rule_fails_on_its_account(team: World) -> None:
    # Replicas out of range: whatever it is corrected to, 4 GPUs per replica pass the limit of 2 already.
    assert _codes(_submit(team, replicas=0, gpus_per_replica=4)) == {
        "replicas": "out_of_range",
        "gpus_per_replica": "above_quota_limit",
    }
    # GPUs out of range: the 2 replicas alone say nothing against the limit, so only the field's rule is named.
    assert _codes(_submit(team, replicas=2, gpus_per_replica=-1)) == {"gpus_per_replica": "out_of_range"}


def test_without_a_pool_the_image_is_still_held_to_the_allow_list(team: World) -> None:
    assert _codes(_submit(team, pool=None, image="docker.io/evil:1")) == {
        "pool": "required",
        "image": "image_not_allowed",
    }


def test_the_api_answers_all_three_at_once_and_writes_nothing(team: World) -> None:
    body = {"project": "alpha", "pool": "shared", **THREE_BAD}
    response = client_for(team.member_a).post(URL, body, format="json")
    assert _api_codes(response) == THREE_CODES
    assert response.json()["error"]["message"].startswith("name: ")
    _nothing_written()


def test_a_bulk_names_every_items_mistakes_field_and_database_rules_alike(team: World) -> None:
    good = {"pool": "shared", "image": "registry.example.com/team/train:1"}
    items: list[dict[str, Any]] = [
        {**good, "name": "fine"},
        {**good, "name": "Bad!", "gpus_per_replica": 3},
        {**good, "name": "evil", "image": "docker.io/evil:1"},
        {**good, "name": "long", "max_runtime_seconds": 7200, "gpu_models": ["B200"]},
        {**good, "name": "Worse!", "image": "UPPER"},
    ]
    response = client_for(team.member_a).post(f"{URL}bulk/", {"project": "alpha", "items": items}, format="json")
    assert _api_codes(response) == {
        "items[1].name": "invalid_name",
        "items[1].gpus_per_replica": "above_quota_limit",
        "items[2].image": "image_not_allowed",
        "items[3].max_runtime_seconds": "above_max_runtime",
        "items[3].gpu_models": "unknown_gpu_model",
        "items[4].name": "invalid_name",
        "items[4].image": "invalid_image",
    }
    # Item by item, in the order sent.
    assert list(response.json()["error"]["fields"])[:2] == ["items[1].name", "items[1].gpus_per_replica"]
    _nothing_written()


def test_a_request_with_mistakes_is_no_retry_of_an_accepted_one(team: World) -> None:
    actor = Actor(user=team.member_a)
    first = services.submit_workload(actor=actor, project=team.project_a, data=request(team), idempotency_key="k")
    with pytest.raises(ValidationError) as caught:
        services.submit_workload(
            actor=actor, project=team.project_a, data=request(team, name="Bad!"), idempotency_key="k"
        )
    assert _codes(caught.value) == {"name": "invalid_name"}
    assert list(Workload.all_tenants.values_list("pk", flat=True)) == [first.pk]


def test_count_limits_are_named_with_the_field_rules(world: World) -> None:
    give_quota(world, max_pending_workloads=1)
    add_node(world)
    assign(world.member_a, world.project_a)
    items = [request(world, name="one"), request(world, name="Two!")]
    with pytest.raises(ValidationError) as caught:
        services.submit_workloads(actor=Actor(user=world.member_a), project=world.project_a, items=items)
    assert _codes(caught.value) == {"items[1].name": "invalid_name", "project": "max_pending_workloads"}
    _nothing_written()


def test_a_bulk_full_of_mistakes_is_still_read_set_based(team: World, django_assert_max_num_queries: Any) -> None:
    items = [request(team, name=f"job-{i}") for i in range(300)]
    for i in range(0, 300, 3):
        items[i] = request(team, name=f"Job-{i}", image="docker.io/evil:1", gpus_per_replica=3)
    with django_assert_max_num_queries(12), pytest.raises(ValidationError) as caught:
        services.submit_workloads(actor=Actor(user=team.member_a), project=team.project_a, items=items)
    assert len(caught.value.error_dict) == 300
    assert _codes(caught.value)["items[297].gpus_per_replica"] == "above_quota_limit"
    _nothing_written()


def test_the_api_answers_what_it_cannot_parse_with_the_database_rules_of_the_rest(team: World) -> None:
    body = {"project": "alpha", "pool": "shared", "name": "Bad_Name!", "image": "docker.io/evil:1"}
    response = client_for(team.member_a).post(URL, {**body, "gpus_per_replica": "lots"}, format="json")
    assert _api_codes(response) == {
        "gpus_per_replica": "invalid",
        "name": "invalid_name",
        "image": "image_not_allowed",
    }
    _nothing_written()


def test_a_bulk_item_in_an_unknown_pool_still_has_its_image_held_to_the_allow_list(team: World) -> None:
    good = {"pool": "shared", "image": "registry.example.com/team/train:1"}
    items = [
        {**good, "name": "fine"},
        {"pool": "nowhere", "name": "lost", "image": "docker.io/evil:1"},
        {**good, "name": "greedy", "gpus_per_replica": 3},
    ]
    response = client_for(team.member_a).post(f"{URL}bulk/", {"project": "alpha", "items": items}, format="json")
    assert _api_codes(response) == {
        "items[1].pool": "does_not_exist",
        "items[1].image": "image_not_allowed",
        "items[2].gpus_per_replica": "above_quota_limit",
    }
    _nothing_written()


def test_the_database_rules_of_a_project_one_may_not_submit_into_are_not_told(team: World) -> None:
    # member_a is not on gamma: a submission there is refused whatever its body, before any rule is told.
    Project.all_tenants.create(tenant=team.tenant_a, slug="gamma", name="Gamma")
    body = {"project": "gamma", "pool": "shared", "name": "x", "image": "docker.io/evil:1", "replicas": "two"}
    response = client_for(team.member_a).post(URL, body, format="json")
    assert response.status_code == 403, response.content
    assert "not a member of project gamma" in response.content.decode()
    _nothing_written()


def test_a_refused_field_stands_in_leniently_and_a_missing_project_leaves_the_field_rules(team: World) -> None:
    actor = Actor(user=team.member_a)
    items = [request(team, name="Bad!", image="docker.io/evil:1")]
    # Whatever the GPUs the interface could not read are corrected to, the limit is not what fails.
    found = submission_errors(actor=actor, project=team.project_a, items=items, refused=[{"gpus_per_replica"}])
    assert {field: str(errors[0].code) for field, errors in found.items()} == {
        "name": "invalid_name",
        "image": "image_not_allowed",
    }
    found = submission_errors(actor=actor, project=None, items=items, refused=[{"gpus_per_replica"}], bulk=True)
    assert {field: str(errors[0].code) for field, errors in found.items()} == {"items[0].name": "invalid_name"}
    assert submission_errors(actor=actor, project=team.project_a, items=[request(team)]) == {}
    _nothing_written()
