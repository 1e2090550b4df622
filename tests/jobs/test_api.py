"""The workloads API: submit (single, bulk, idempotent), list with filters, detail with allocations, cancel."""

from __future__ import annotations

from typing import Any

import pytest

from common import fastpaths
from jobs.choices import WorkloadState
from jobs.models import Allocation, Workload
from tests.conftest import World, client_for
from tests.jobs.factories import add_node, ready_world

pytestmark = pytest.mark.django_db

URL = "/api/v1/tenants/tenant-a/workloads/"


def _body(**overrides: Any) -> dict[str, Any]:
    return {"project": "alpha", "pool": "shared", "name": "train", "image": "busybox:1.36", **overrides}


def test_submit_then_retry_with_the_same_key(world: World) -> None:
    ready_world(world)
    client = client_for(world.member_a)
    first = client.post(URL, _body(gpus_per_replica=2), format="json", HTTP_IDEMPOTENCY_KEY="abc")
    assert first.status_code == 201, first.content
    assert first.json()["state"] == "pending" and first.json()["owner"] == "member_a"
    again = client.post(URL, _body(gpus_per_replica=2), format="json", HTTP_IDEMPOTENCY_KEY="abc")
    assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
    clash = client.post(URL, _body(gpus_per_replica=1), format="json", HTTP_IDEMPOTENCY_KEY="abc")
    assert clash.status_code == 409
    assert clash.json()["error"]["code"] == "idempotency_key_reused"


def test_a_refusal_names_the_field_and_rule(world: World) -> None:
    ready_world(world)
    response = client_for(world.member_a).post(URL, _body(gpus_per_replica=9), format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["fields"]["gpus_per_replica"][0]["code"] == "above_quota_limit"
    assert error["message"].startswith("gpus_per_replica: 9 GPUs exceed")


FORBIDDEN = {
    "privileged": True,
    "cap_add": ["NET_ADMIN"],
    "binds": ["/etc:/host-etc"],
    "volumes": ["/var/run/docker.sock:/docker.sock"],
    "network_mode": "host",
    "pid": "host",
    "ipc": "host",
    "devices": ["/dev/mem"],
    "security_opt": ["apparmor=unconfined"],
    "userns_mode": "host",
}


@pytest.mark.parametrize("path", ["", "validate/"])
def test_container_options_are_refused_each_by_name_with_every_other_rule(world: World, path: str) -> None:
    ready_world(world)
    body = _body(name="Bad Name", gpus_per_replica=9, **FORBIDDEN)
    response = client_for(world.member_a).post(f"{URL}{path}", body, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert {key: fields[key][0]["code"] for key in FORBIDDEN} == dict.fromkeys(FORBIDDEN, "unknown_field")
    assert (fields["name"][0]["code"], fields["gpus_per_replica"][0]["code"]) == ("invalid_name", "above_quota_limit")
    assert not Workload.all_tenants.exists()


@pytest.mark.parametrize("path", ["", "validate/"])
def test_container_options_in_a_bulk_are_named_per_item_and_beside_the_items(world: World, path: str) -> None:
    ready_world(world)
    items = [
        {"name": "ok", "image": "busybox:1", "pool": "shared"},
        {"name": "bad", "image": "busybox:1", "pool": "shared", "privileged": True, "host_config": {"pid": "host"}},
    ]
    body = {"project": "alpha", "items": items, "network_mode": "host"}
    response = client_for(world.member_a).post(f"{URL}bulk/{path}", body, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    codes = {key: errors[0]["code"] for key, errors in fields.items()}
    assert codes == {
        "items[1].privileged": "unknown_field",
        "items[1].host_config": "unknown_field",
        "network_mode": "unknown_field",
    }
    assert not Workload.all_tenants.exists()


@pytest.mark.parametrize(("field", "value"), [("project", "beta"), ("pool", "private")])
def test_references_of_another_tenant_read_as_missing(world: World, field: str, value: str) -> None:
    from inventory.models import NodePool

    ready_world(world)
    NodePool.objects.create(name="private", dedicated_tenant=world.tenant_b)
    response = client_for(world.admin_a).post(URL, _body(**{field: value}), format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert not Workload.all_tenants.exists()


def test_bulk_submission(world: World) -> None:
    ready_world(world)
    items = [{"name": f"job-{i}", "image": "busybox:1", "pool": "shared"} for i in range(3)]
    client = client_for(world.member_a)
    response = client.post(f"{URL}bulk/", {"project": "alpha", "items": items}, format="json")
    assert response.status_code == 201, response.content
    assert [w["name"] for w in response.json()["results"]] == ["job-0", "job-1", "job-2"]
    items[1]["pool"] = "nowhere"
    refused = client.post(f"{URL}bulk/", {"project": "alpha", "items": items}, format="json")
    assert refused.status_code == 400
    assert "items[1].pool" in refused.json()["error"]["fields"]
    assert Workload.all_tenants.count() == 3


def test_list_filters_and_ordering(world: World) -> None:
    ready_world(world)
    client = client_for(world.member_a)
    for name, kind in (("a-job", "job"), ("b-notebook", "notebook"), ("c-job", "job")):
        assert client.post(URL, _body(name=name, kind=kind), format="json").status_code == 201
    Workload.all_tenants.filter(name="c-job").update(state=WorkloadState.RUNNING)
    viewer = client_for(world.viewer_a)
    names = lambda query: [w["name"] for w in viewer.get(f"{URL}?{query}").json()["results"]]  # noqa: E731
    assert names("kind=notebook") == ["b-notebook"]
    assert names("state=running") == ["c-job"]
    assert names("ordering=name") == ["a-job", "b-notebook", "c-job"]
    assert names("owner=member_a&project=alpha&ordering=-name") == ["c-job", "b-notebook", "a-job"]
    assert names("owner=admin_a") == []


def test_detail_shows_allocations_reason_and_events(world: World) -> None:
    ready_world(world)
    created = client_for(world.member_a).post(URL, _body(), format="json").json()
    gpu = add_node(world, "n2", gpus=2).gpus.get(index=1)
    Allocation.all_tenants.create(tenant=world.tenant_a, workload_id=created["id"], replica=0, node=gpu.node, gpu=gpu)
    Workload.all_tenants.filter(pk=created["id"]).update(
        reason_code="QUOTA_LIMIT", reason_message="At the limit.", queue_position=3
    )
    body = client_for(world.viewer_a).get(f"{URL}{created['id']}/").json()
    assert body["allocations"] == [
        {
            "replica": 0,
            "node": "n2",
            "gpu_index": 1,
            "gpu_uuid": "GPU-n2-1",
            "gpu_model": gpu.model,
            "created_at": body["allocations"][0]["created_at"],
            "released_at": None,
        }
    ]
    assert (body["reason_code"], body["queue_position"]) == ("QUOTA_LIMIT", 3)
    assert [e["kind"] for e in body["events"]] == ["workload.submitted"]


def test_cancel_and_cancel_again(world: World) -> None:
    ready_world(world)
    client = client_for(world.member_a)
    created = client.post(URL, _body(), format="json").json()
    response = client.post(f"{URL}{created['id']}/cancel/")
    assert (response.status_code, response.json()["state"]) == (200, "cancelled")
    again = client.post(f"{URL}{created['id']}/cancel/")
    assert again.status_code == 409
    assert again.json()["error"]["details"]["current_state"] == "cancelled"


def test_another_tenants_workload_is_not_found(world: World) -> None:
    ready_world(world)
    created = client_for(world.member_a).post(URL, _body(), format="json").json()
    outsider = client_for(world.admin_b)
    assert outsider.get(f"/api/v1/tenants/tenant-b/workloads/{created['id']}/").status_code == 404
    assert outsider.post(f"/api/v1/tenants/tenant-b/workloads/{created['id']}/cancel/").status_code == 404
    assert outsider.get("/api/v1/tenants/tenant-b/workloads/").json()["count"] == 0


def test_the_openapi_schema_describes_the_endpoints(world: World) -> None:
    schema = client_for(world.operator).get("/api/v1/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/v1/tenants/{tenant}/workloads/{id}/cancel/" in paths
    assert "/api/v1/tenants/{tenant}/workloads/bulk/" in paths


def _token_client(world: World, user: Any, role: str) -> Any:
    from rest_framework.test import APIClient

    from tenants import services
    from tenants.context import Actor

    issued = services.create_token(
        actor=Actor(user=user), tenant=world.tenant_a, name="t", role=role, expires_in_days=1
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    return client


def test_a_token_submission_reads_its_role_once(world: World) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ready_world(world)
    client = _token_client(world, world.admin_a, "admin")
    assert client.post(URL, _body(name="warm"), format="json").status_code == 201  # records last_used_at
    with CaptureQueriesContext(connection) as queries:
        response = client.post(URL, _body(), format="json")
    assert response.status_code == 201, response.content
    membership_reads = [q["sql"] for q in queries if '"tenants_membership"' in q["sql"]]
    # The authentication query carries the membership role; neither the base nor the service reads it again.
    assert len(membership_reads) == 1 and '"tenants_apitoken"' in membership_reads[0]
    # token with owner, tenant and role (1), project (1), pool (1); images, limits, GPUs (3); budgets (1);
    # the run-time history its prediction reads (1); workload, events, audit (3). Before the token carried
    # the role: 13 (without the prediction). With the fast path jobs_sql off the events take two statements
    # (the workloads read, then inserted), not one INSERT ... SELECT.
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT"))]
    assert len(statements) == (11 if fastpaths.enabled(fastpaths.JOBS_SQL) else 12), statements


def test_a_token_loses_its_role_on_the_next_request(world: World) -> None:
    from tenants.models import Membership

    ready_world(world)
    client = _token_client(world, world.member_a, "member")
    assert client.post(URL, _body(name="first"), format="json").status_code == 201
    Membership.all_tenants.filter(tenant=world.tenant_a, user=world.member_a).update(role="viewer")
    assert client.post(URL, _body(name="second"), format="json").status_code == 403
    Membership.all_tenants.filter(tenant=world.tenant_a, user=world.member_a).delete()
    assert client.post(URL, _body(name="third"), format="json").status_code == 401


def test_a_role_read_in_a_request_is_not_reused_after_it(world: World) -> None:
    from django.core.exceptions import PermissionDenied

    from tenants.choices import Role
    from tenants.context import Actor
    from tenants.models import Membership
    from tenants.services.access import require_role

    ready_world(world)
    assert client_for(world.member_a).post(URL, _body(), format="json").status_code == 201
    Membership.all_tenants.filter(tenant=world.tenant_a, user=world.member_a).update(role="viewer")
    with pytest.raises(PermissionDenied):
        require_role(Actor(user=world.member_a), world.tenant_a, Role.MEMBER)
