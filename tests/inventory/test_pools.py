"""Node pools: operators manage them; tenants see shared pools and their own dedicated ones only."""

from __future__ import annotations

from inventory.models import NodePool
from tests.conftest import World, client_for

POOLS = "/api/v1/node-pools/"


def test_operator_manages_pools(world: World) -> None:
    operator = client_for(world.operator)
    created = operator.post(
        POOLS, {"name": "h100", "description": "H100 nodes", "dedicated_tenant": "tenant-b"}, format="json"
    )
    assert created.status_code == 201 and created.json()["dedicated_tenant"] == "tenant-b"
    assert operator.patch(f"{POOLS}h100/", {"dedicated_tenant": None}, format="json").json()["dedicated_tenant"] is None
    assert operator.delete(f"{POOLS}h100/").status_code == 204
    assert not NodePool.objects.filter(name="h100").exists()


def test_tenants_see_shared_and_their_own_dedicated_pools_only(world: World) -> None:
    NodePool.objects.create(name="a-only", dedicated_tenant=world.tenant_a)
    NodePool.objects.create(name="b-only", dedicated_tenant=world.tenant_b)
    names = {p["name"] for p in client_for(world.member_a).get(POOLS).json()["results"]}
    assert names == {"shared", "a-only"}
    assert client_for(world.member_a).get(f"{POOLS}b-only/").status_code == 404
    assert client_for(world.admin_b).get(f"{POOLS}a-only/").status_code == 404
    assert {p["name"] for p in client_for(world.operator).get(POOLS).json()["results"]} == {
        "shared",
        "a-only",
        "b-only",
    }


def test_pool_names_follow_the_slug_rule(world: World) -> None:
    response = client_for(world.operator).post(POOLS, {"name": "Not A Slug"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["name"][0]["code"] == "invalid_slug"


def test_dedicating_a_pool_where_others_hold_quota_is_refused(world: World) -> None:
    response = client_for(world.operator).patch(f"{POOLS}shared/", {"dedicated_tenant": "tenant-b"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["dedicated_tenant"][0]["code"] == "pool_has_other_tenants"
    assert NodePool.objects.get(name="shared").dedicated_tenant is None


def test_pool_with_quotas_cannot_be_deleted(world: World) -> None:
    response = client_for(world.operator).delete(f"{POOLS}shared/")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "pool_in_use"


def test_empty_tenant_can_be_deleted_and_a_busy_one_cannot(world: World) -> None:
    operator = client_for(world.operator)
    assert operator.post("/api/v1/tenants/", {"slug": "empty", "name": "Empty"}, format="json").status_code == 201
    assert operator.delete("/api/v1/tenants/empty/").status_code == 204
    busy = operator.delete("/api/v1/tenants/tenant-a/")
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "tenant_not_empty"


def test_placement_policy_defaults_to_binpacking_and_only_known_policies_are_accepted(world: World) -> None:
    operator = client_for(world.operator)
    created = operator.post(POOLS, {"name": "batch"}, format="json")
    assert created.json()["placement_policy"] == "binpack"
    spread = operator.patch(f"{POOLS}batch/", {"placement_policy": "spread"}, format="json")
    assert spread.status_code == 200 and NodePool.objects.get(name="batch").placement_policy == "spread"
    refused = operator.patch(f"{POOLS}batch/", {"placement_policy": "random"}, format="json")
    assert refused.status_code == 400
    assert refused.json()["error"]["fields"]["placement_policy"][0]["code"] == "invalid_choice"
    assert NodePool.objects.get(name="batch").placement_policy == "spread"


def test_every_failing_field_of_a_new_pool_is_named_at_once(world: World) -> None:
    operator = client_for(world.operator)
    response = operator.post(
        POOLS, {"name": "shared", "placement_policy": "random", "dedicated_tenant": "nobody"}, format="json"
    )
    assert response.status_code == 400, response.content
    codes = {field: errors[0]["code"] for field, errors in response.json()["error"]["fields"].items()}
    assert codes == {"name": "unique", "placement_policy": "invalid_choice", "dedicated_tenant": "does_not_exist"}
    assert NodePool.objects.count() == 1


def test_operators_set_a_pools_usage_half_life_and_tenants_only_read_it(world: World) -> None:
    operator = client_for(world.operator)
    created = operator.post(POOLS, {"name": "h100"}, format="json").json()
    assert created["usage_half_life_seconds"] == 7 * 86400, "Slurm's default"

    changed = operator.patch(f"{POOLS}h100/", {"usage_half_life_seconds": 3600}, format="json")
    too_long = operator.patch(f"{POOLS}h100/", {"usage_half_life_seconds": 400 * 86400}, format="json")
    by_member = client_for(world.member_a).patch(f"{POOLS}shared/", {"usage_half_life_seconds": 0}, format="json")

    assert changed.status_code == 200 and changed.json()["usage_half_life_seconds"] == 3600
    assert too_long.status_code == 400 and "usage_half_life_seconds" in too_long.json()["error"]["fields"]
    assert by_member.status_code == 403
    assert NodePool.objects.get(name="shared").usage_half_life_seconds == 7 * 86400
    assert client_for(world.member_a).get(f"{POOLS}shared/").json()["usage_half_life_seconds"] == 7 * 86400
