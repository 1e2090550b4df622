"""The operators' inventory pages: nodes, a node's lifecycle actions, GPUs, pool capacity; tenants see capacity only."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from inventory import services
from inventory.choices import GpuHealth, NodeState
from inventory.holds import register_gpu_holder, unregister_gpu_holder
from inventory.models import Gpu, Node, NodeEvent, NodePool
from inventory.selectors import UNKNOWN_AGENTS_KEY
from tenants.context import Actor
from tenants.models import AuditEvent
from tests.conftest import World
from tests.frontend.test_pages import logged_in

S = NodeState
OPS_PAGES = ["/ops/nodes/", "/ops/nodes/n1/", "/ops/gpus/"]
H100 = "NVIDIA H100 80GB HBM3"


def make_node(
    world: World,
    name: str = "n1",
    *,
    state: NodeState = S.READY,
    gpus: int = 0,
    pool: NodePool | None = None,
    model: str = H100,
    **kwargs: Any,
) -> Node:
    """Register a node through the services and walk it to `state` (ready by way of provisioning), with GPUs."""
    operator = Actor(user=world.operator)
    kwargs.setdefault("runtime", "simulated")
    node = services.register_node(actor=operator, name=name, pool=pool or world.pool, **kwargs)
    path = {S.REGISTERED: [], S.PROVISIONING: [S.PROVISIONING], S.READY: [S.PROVISIONING, S.READY]}
    path[S.CORDONED] = [*path[S.READY], S.CORDONED]
    with transaction.atomic():
        for step in path[state]:
            node = services.transition_node(node, step, actor=operator, reason="setup", action=f"node.{step}")
    Gpu.objects.bulk_create(
        Gpu(node=node, index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=81559) for i in range(gpus)
    )
    return node


def register_form(**overrides: Any) -> dict[str, Any]:
    data = {"name": "gpu-01", "pool": "shared", "kind": "bare_metal", "runtime": "docker", "address": "10.0.0.1"}
    data.update(overrides)
    return {f"new-{key}": value for key, value in data.items()}


@pytest.mark.parametrize("path", OPS_PAGES)
def test_inventory_pages_do_not_exist_for_tenant_users(world: World, path: str) -> None:
    make_node(world)
    for username in ("admin_a", "member_a", "viewer_a"):
        assert logged_in(username).get(path).status_code == 404, username
    assert logged_in("operator").get(path).status_code == 200


def test_tenant_users_cannot_act_on_nodes_by_posting(world: World) -> None:
    node = make_node(world)
    client = logged_in("admin_a")
    assert client.post("/ops/nodes/n1/", {"action": "cordon", "cordon-reason": "mine now"}).status_code == 404
    assert client.post("/ops/nodes/", register_form()).status_code == 404
    node.refresh_from_db()
    assert node.state == S.READY
    assert not Node.objects.filter(name="gpu-01").exists()


def test_operator_menu_links_nodes_and_gpus(world: World) -> None:
    page = logged_in("operator").get("/ops/nodes/").content.decode()
    menu = page.split('id="operator-menu"')[1].split("</details>")[0]
    assert 'href="/ops/nodes/"' in menu and 'href="/ops/gpus/"' in menu


def test_node_list_shows_state_gpus_and_runtime_badges(world: World) -> None:
    make_node(world, "sim-1", gpus=2)
    cordoned = make_node(world, "proc-1", state=S.CORDONED, runtime="process")
    Gpu.objects.create(node=cordoned, index=0, uuid="GPU-p", model=H100, health=GpuHealth.FAILED)
    page = logged_in("operator").get("/ops/nodes/").content.decode()
    sim = page.split('data-node="sim-1"')[1].split("</tr>")[0]
    proc = page.split('data-node="proc-1"')[1].split("</tr>")[0]
    assert 'href="/ops/nodes/sim-1/"' in sim
    assert "simulated" in sim and "not isolated" not in sim
    assert "not isolated" in proc and "badge-sim" not in proc
    assert "Cordoned" in proc and "setup" in proc, "the state is shown with its reason"
    assert "1 failed" in proc
    assert ">2<" in sim.replace(" ", "").replace("\n", "")


def test_node_list_filters_by_pool_and_state(world: World) -> None:
    other = NodePool.objects.create(name="other")
    make_node(world, "a-ready")
    make_node(world, "a-new", state=S.REGISTERED)
    make_node(world, "b-ready", pool=other)
    client = logged_in("operator")

    def listed(query: str) -> set[str]:
        page = client.get(f"/ops/nodes/?{query}").content.decode()
        return {name for name in ("a-ready", "a-new", "b-ready") if f'data-node="{name}"' in page}

    assert listed("") == {"a-ready", "a-new", "b-ready"}
    assert listed("pool=shared") == {"a-ready", "a-new"}
    assert listed("state=ready") == {"a-ready", "b-ready"}
    assert listed("pool=other&state=ready") == {"b-ready"}
    assert listed("state=bogus") == {"a-ready", "a-new", "b-ready"}, "an unknown filter value filters nothing"


def test_operator_registers_a_node_with_one_audit_event(world: World) -> None:
    before = AuditEvent.all_tenants.count()
    form = register_form(labels="zone=a\n\nrack = r12\n", cpu_cores="", memory_mib="")
    response = logged_in("operator").post("/ops/nodes/", form)
    assert response.status_code == 302
    node = Node.objects.get(name="gpu-01")
    assert (node.pool, node.runtime, node.state, node.cpu_cores) == (world.pool, "docker", S.REGISTERED, 0)
    assert node.labels == {"zone": "a", "rack": "r12"}
    assert list(AuditEvent.all_tenants.filter(pk__gt=before).values_list("action", "via")) == [("node.register", "ui")]
    assert NodeEvent.objects.filter(node=node, kind="node.registered").exists()


def test_operator_registers_a_simulated_node_with_its_gpus(world: World) -> None:
    form = register_form(name="sim-9", runtime="simulated", simulated_gpu_count=4, simulated_gpu_model="Fake A100")
    assert logged_in("operator").post("/ops/nodes/", form).status_code == 302
    node = Node.objects.get(name="sim-9")
    assert (node.simulated_gpu_count, node.simulated_gpu_model) == (4, "Fake A100")


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"name": "Bad_Name!"}, "name", "lowercase letters"),
        ({"runtime": "docker", "simulated_gpu_count": 2}, "simulated_gpu_count", "Only simulated nodes"),
        ({"labels": "zone a"}, "labels", "Line 1: write key=value."),
        ({"runtime": "simulated", "simulated_gpu_count": 65}, "simulated_gpu_count", "0 to 64"),
    ],
)
def test_bad_registration_shows_the_error_on_its_field_and_writes_nothing(
    world: World, overrides: dict[str, Any], field: str, message: str
) -> None:
    before = AuditEvent.all_tenants.count()
    response = logged_in("operator").post("/ops/nodes/", register_form(**overrides))
    assert response.status_code == 200
    page = response.content.decode()
    error = page.split(f'data-field="{field}"')[1].split("</small>")[0]
    assert message in error
    assert not Node.objects.exists()
    assert AuditEvent.all_tenants.count() == before


def test_duplicate_node_name_is_refused_on_the_name_field(world: World) -> None:
    make_node(world, "gpu-01")
    response = logged_in("operator").post("/ops/nodes/", register_form())
    assert "already exists" in response.content.decode().split('data-field="name"')[1]


def test_register_form_suggests_agents_nobody_registered(world: World) -> None:
    make_node(world, "taken-1")
    cache.set(UNKNOWN_AGENTS_KEY, {"gpu-07": timezone.now().isoformat(), "taken-1": timezone.now().isoformat()})
    page = logged_in("operator").get("/ops/nodes/").content.decode()
    suggestions = page.split('id="unknown-agents-list"')[1].split("</div>")[0]
    assert 'data-value="gpu-07"' in suggestions and '<option value="gpu-07">' in suggestions
    assert "taken-1" not in suggestions, "a name registered meanwhile is no longer suggested"
    assert 'list="unknown-agents"' in page


def test_simulated_fields_are_marked_to_show_only_for_the_simulated_runtime(world: World) -> None:
    page = logged_in("operator").get("/ops/nodes/").content.decode()
    assert page.count('data-only-with="new-runtime=simulated"') == 2


def test_node_detail_shows_summary_versions_gpus_and_history(world: World) -> None:
    node = make_node(world, "n1", gpus=2, labels={"zone": "a"})
    Node.objects.filter(pk=node.pk).update(
        engine_version="27.3.1",
        runc_version="1.1.14",
        nvidia_driver_version="550.90.07",
        cuda_version="12.4",
        toolkit_version="1.17.3",
        agent_version="0.4.0",
        nvidia_runtime=True,
        device_requests=True,
        probed_at=timezone.now(),
    )
    Gpu.objects.filter(node=node, index=1).update(
        health=GpuHealth.DEGRADED, health_reason="ECC errors rising", utilization=57.4, memory_used_mib=2048
    )
    page = logged_in("operator").get("/ops/nodes/n1/").content.decode()
    for text in ("27.3.1", "1.1.14", "550.90.07", "12.4", "1.17.3", "0.4.0", "zone=a", "control", "shared"):
        assert text in page, text
    gpus = page.split('id="node-gpus"')[1].split("</table>")[0]
    assert "GPU-n1-0" in gpus and "GPU-n1-1" in gpus and "79.6 GiB" in gpus
    assert "Degraded" in gpus and "ECC errors rising" in gpus and "57%" in gpus and "2 GiB" in gpus
    history = page.split('id="node-events"')[1].split("</table>")[0]
    assert "node.registered" in history and "registered → provisioning" in history
    assert "provisioning → ready" in history and "operator" in history
    assert 'id="simulated-note"' in page and 'id="not-isolated"' not in page


def test_process_runtime_is_flagged_not_isolated_on_its_page(world: World) -> None:
    make_node(world, "p1", runtime="process")
    page = logged_in("operator").get("/ops/nodes/p1/").content.decode()
    assert 'id="not-isolated"' in page and "not isolated" in page
    assert 'id="simulated-note"' not in page


def offered(page: str) -> set[str]:
    return {
        name
        for name in ("provision", "cordon", "uncordon", "drain", "maintenance", "retire")
        if f'id="action-{name}"' in page
    }


@pytest.mark.parametrize(
    ("state", "actions"),
    [
        (S.REGISTERED, {"provision", "retire"}),
        (S.PROVISIONING, set()),
        (S.READY, {"cordon", "drain", "maintenance"}),
        (S.CORDONED, {"uncordon", "drain", "maintenance"}),
    ],
)
def test_actions_offered_are_those_the_lifecycle_allows(world: World, state: NodeState, actions: set[str]) -> None:
    make_node(world, state=state)
    assert offered(logged_in("operator").get("/ops/nodes/n1/").content.decode()) == actions


@pytest.mark.parametrize(
    ("state", "action", "data", "after"),
    [
        (S.REGISTERED, "provision", {}, S.PROVISIONING),
        (S.READY, "cordon", {"cordon-reason": "flaky fan"}, S.CORDONED),
        (S.CORDONED, "uncordon", {}, S.READY),
        (S.READY, "drain", {"drain-reason": "kernel update"}, S.MAINTENANCE),
        (S.CORDONED, "maintenance", {"maintenance-reason": "swap a GPU"}, S.MAINTENANCE),
        (S.REGISTERED, "retire", {"retire-confirm": "on", "retire-reason": "returned"}, S.RETIRED),
    ],
)
def test_each_action_changes_the_state_through_its_service(
    world: World, state: NodeState, action: str, data: dict[str, str], after: NodeState
) -> None:
    node = make_node(world, state=state)
    client = logged_in("operator")
    response = client.post("/ops/nodes/n1/", {"action": action, **data})
    assert response.status_code == 302 and response["Location"] == "/ops/nodes/n1/"
    node.refresh_from_db()
    assert node.state == after
    assert AuditEvent.all_tenants.filter(action=f"node.{action}", actor_label="operator").exists()
    page = client.get("/ops/nodes/n1/").content.decode()
    assert f"Node n1: {state} → {after}." in page
    reason = next(iter(data.values()), "") if action != "retire" else "returned"
    assert reason in page.split('id="node-events"')[1]


def test_cordon_without_a_reason_shows_the_error_and_changes_nothing(world: World) -> None:
    node = make_node(world)
    response = logged_in("operator").post("/ops/nodes/n1/", {"action": "cordon", "cordon-reason": "  "})
    assert response.status_code == 200
    form = response.content.decode().split('id="action-cordon"')[1].split("</form>")[0]
    assert form.startswith(" data-errors>"), "the form with the error is marked"
    assert "Say why the node becomes cordoned." in form.split('data-field="reason"')[1]
    node.refresh_from_db()
    assert node.state == S.READY


def test_retire_needs_its_confirmation(world: World) -> None:
    node = make_node(world, state=S.REGISTERED)
    response = logged_in("operator").post("/ops/nodes/n1/", {"action": "retire"})
    assert response.status_code == 200
    assert 'data-field="confirm"' in response.content.decode()
    node.refresh_from_db()
    assert node.state == S.REGISTERED


def test_an_action_the_state_forbids_answers_409_with_the_current_state(world: World) -> None:
    """A page left open while the node moved on: the service refuses, the page says where the node is now."""
    node = make_node(world, state=S.REGISTERED)
    before = AuditEvent.all_tenants.count()
    response = logged_in("operator").post("/ops/nodes/n1/", {"action": "cordon", "cordon-reason": "stale page"})
    assert response.status_code == 409
    conflict = response.content.decode().split('id="conflict"')[1].split("</div>")[0]
    assert "Cordon refused." in conflict
    assert "Node n1 is registered; it cannot become cordoned." in conflict
    assert "<strong>registered</strong> now" in conflict
    node.refresh_from_db()
    assert node.state == S.REGISTERED
    assert AuditEvent.all_tenants.count() == before


def test_maintenance_while_gpus_are_held_answers_409_and_the_node_stays(world: World) -> None:
    make_node(world, gpus=2)
    register_gpu_holder("test-pages", lambda node_ids: dict.fromkeys(node_ids, 2))
    try:
        response = logged_in("operator").post(
            "/ops/nodes/n1/", {"action": "maintenance", "maintenance-reason": "swap a GPU"}
        )
    finally:
        unregister_gpu_holder("test-pages")
    assert response.status_code == 409
    conflict = response.content.decode().split('id="conflict"')[1].split("</div>")[0]
    assert "Maintenance refused." in conflict and "still hold node n1" in conflict
    assert "<strong>ready</strong> now" in conflict
    assert Node.objects.get(name="n1").state == S.READY


def test_unknown_node_is_not_found(world: World) -> None:
    assert logged_in("operator").get("/ops/nodes/nope/").status_code == 404


def test_gpus_page_lists_failed_then_degraded_first_and_filters(world: World) -> None:
    other = NodePool.objects.create(name="other")
    make_node(world, "a1", gpus=2)
    make_node(world, "z9", gpus=2, pool=other)
    Gpu.objects.filter(uuid="GPU-z9-1").update(health=GpuHealth.FAILED, health_reason="fell off the bus")
    Gpu.objects.filter(uuid="GPU-a1-1").update(health=GpuHealth.DEGRADED)
    client = logged_in("operator")

    def rows(query: str = "") -> list[str]:
        page = client.get(f"/ops/gpus/?{query}").content.decode()
        return [chunk.split('"')[0] for chunk in page.split('data-uuid="')[1:]]

    assert rows() == ["GPU-z9-1", "GPU-a1-1", "GPU-a1-0", "GPU-z9-0"]
    assert rows("health=failed") == ["GPU-z9-1"]
    assert rows("pool=shared") == ["GPU-a1-1", "GPU-a1-0"]
    assert "fell off the bus" in client.get("/ops/gpus/").content.decode()


def test_pools_page_shows_node_count_and_capacity_per_model(world: World) -> None:
    make_node(world, "a1", gpus=4)
    make_node(world, "a2", gpus=2, state=S.CORDONED, model="NVIDIA A100-SXM4-80GB")
    make_node(world, "a3", state=S.REGISTERED)
    page = logged_in("operator").get("/ops/pools/").content.decode()
    row = page.split('data-pool="shared"')[1].split("</tr>")[0]
    assert ">3</a>" in row
    flat = " ".join(row.split())
    assert "NVIDIA H100 80GB HBM3</span> <strong>4</strong> free / 4" in flat
    assert "NVIDIA A100-SXM4-80GB</span> <strong>0</strong> free / 2" in flat


def test_tenant_overview_shows_capacity_per_model_and_no_node_details(world: World) -> None:
    dedicated_b = NodePool.objects.create(name="b-only", dedicated_tenant=world.tenant_b)
    make_node(world, "secret-node-1", gpus=4)
    make_node(world, "secret-node-2", gpus=4, state=S.CORDONED)
    make_node(world, "b-node", gpus=8, pool=dedicated_b, model="NVIDIA B200")
    for username in ("member_a", "viewer_a", "admin_a"):
        page = logged_in(username).get("/t/tenant-a/").content.decode()
        capacity = " ".join(page.split('id="capacity"')[1].split("</table>")[0].split())
        assert "<code>shared</code></td><td>NVIDIA H100 80GB HBM3</td><td>4</td><td>8</td>" in capacity
        assert "b-only" not in page and "B200" not in page, "another tenant's dedicated pool stays invisible"
        assert "secret-node" not in page and "GPU-" not in page


def test_inventory_pages_use_a_bounded_number_of_queries(world: World, django_assert_max_num_queries: Any) -> None:
    """20 nodes of 8 GPUs each: no page queries per row (session, user, the navigation, then the page's reads)."""
    for i in range(20):
        make_node(world, f"n{i:02}", gpus=8)
    for gpu in Gpu.objects.filter(index=0):
        NodeEvent.objects.create(node=gpu.node, gpu=gpu, kind="gpu.degraded", message="hot")
    client = logged_in("operator")
    with django_assert_max_num_queries(6):
        assert client.get("/ops/nodes/").content.decode().count("data-node=") == 20
    with django_assert_max_num_queries(7):  # and the holders of its GPUs
        page = client.get("/ops/nodes/n00/").content.decode()
    assert page.count("<code>GPU-n00-") == 8 and page.count("gpu.degraded") == 1
    with django_assert_max_num_queries(6):
        assert client.get("/ops/gpus/").content.decode().count("data-uuid=") == 100
    # One more than the node pages: what holds the GPUs (active allocations) is counted too.
    with django_assert_max_num_queries(7):
        assert "160</strong> free / 160" in client.get("/ops/pools/").content.decode()
    with django_assert_max_num_queries(11):  # and the viewer's notebooks that ask something of them
        assert "<td>160</td><td>160</td>" in client.get("/t/tenant-a/").content.decode()


def test_operators_create_and_change_a_pools_placement_policy(world: World) -> None:
    client = logged_in("operator")
    client.post("/ops/pools/", {"name": "train", "placement_policy": "spread"})
    assert NodePool.objects.get(name="train").placement_policy == "spread"
    client.post("/ops/pools/train/", {"description": "", "placement_policy": "binpack"})
    assert NodePool.objects.get(name="train").placement_policy == "binpack"
    row = client.get("/ops/pools/").content.decode().split('data-pool="train"')[1].split("</tr>")[0]
    assert "Bin-packing (fill nodes first)" in row


@pytest.mark.parametrize(
    ("swarm", "manager", "shown"),
    [
        ("m1abc", True, "<code>m1abc</code> (manager)"),
        ("m1abc", False, "<code>m1abc</code> (worker)"),
        ("", False, "none: its gangs stay on this node"),
        (None, False, "Docker swarm</th><td>—"),
    ],
)
def test_a_docker_node_page_shows_its_swarm(world: World, swarm: str | None, manager: bool, shown: str) -> None:
    node = make_node(world, "d1", runtime="docker")
    Node.objects.filter(pk=node.pk).update(swarm=swarm, swarm_manager=manager)
    page = logged_in("operator").get("/ops/nodes/d1/").content.decode()
    assert shown in page.split('id="node-versions"')[1].split("</table>")[0]


def test_operators_set_a_pools_usage_half_life_on_the_pools_page(world: World) -> None:
    client = logged_in("operator")
    client.post("/ops/pools/", {"name": "train", "placement_policy": "spread"})
    assert NodePool.objects.get(name="train").usage_half_life_seconds == 7 * 86400, "left empty: the default"
    client.post("/ops/pools/train/", {"description": "", "usage_half_life_seconds": "3600"})
    assert NodePool.objects.get(name="train").usage_half_life_seconds == 3600
    refused = client.post("/ops/pools/train/", {"description": "", "usage_half_life_seconds": "soon"}, follow=True)
    assert "whole number of seconds" in refused.content.decode()
    row = client.get("/ops/pools/").content.decode().split('data-pool="train"')[1].split("</tr>")[0]
    assert 'name="usage_half_life_seconds"' in row and 'value="3600"' in row and 'title="1 h"' in row
