"""The empty cluster page's demo-fleet button: operators add the simulated fleet; nobody else sees or reaches it."""

from __future__ import annotations

from django.test import Client

from inventory.models import Node
from jobs.models import Workload
from jobs.services.demo import DEMO_TENANT, NODES, WORK
from tests.conftest import World
from tests.frontend.test_pages import logged_in


def test_the_empty_cluster_page_offers_the_demo_fleet_and_the_button_adds_it_once(world: World) -> None:
    client = logged_in("operator")
    page = client.get("/ops/cluster/").content.decode()
    assert 'id="demo-fleet"' in page and "Add a simulated demo fleet" in page

    response = client.post("/ops/cluster/demo/", follow=True)
    assert response.redirect_chain[-1][0] == "/ops/cluster/"
    assert "Simulated demo fleet added: 4 nodes of 8 GPUs in pool sim-demo" in response.content.decode()
    assert sorted(Node.objects.filter(runtime="simulated").values_list("name", flat=True)) == sorted(
        name for name, _ in NODES
    )

    again = client.post("/ops/cluster/demo/", follow=True).content.decode()
    assert "already here" in again
    assert Workload.all_tenants.filter(tenant__slug=DEMO_TENANT).count() == len(WORK)


def test_only_operators_reach_it_and_only_by_post(world: World) -> None:
    assert logged_in("operator").get("/ops/cluster/demo/").status_code == 405
    assert logged_in("admin_a").post("/ops/cluster/demo/").status_code == 404
    assert Client().post("/ops/cluster/demo/").status_code == 302  # to the login page
    assert not Node.objects.exists()
