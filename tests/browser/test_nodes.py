"""Nodes in a real Chromium: an operator registers a simulated node, provisions it and cordons it with a reason."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from inventory.choices import NodeState
from inventory.models import Node, NodePool
from inventory.services import transition_node
from tenants.context import Actor
from tests.browser.test_console import log_in
from tests.conftest import World

pytestmark = pytest.mark.browser


def finish_provisioning(node: Node, world: World) -> None:
    """Stand in for the agent's probe passing: what `complete_provisioning` does for a healthy node."""
    with transaction.atomic():
        transition_node(node, NodeState.READY, actor=Actor(user=world.operator), action="node.ready")


def test_operator_registers_provisions_and_cordons_a_simulated_node(live_world: World, page: Any) -> None:
    log_in(page, "operator")
    page.wait_for_url("**/")
    page.locator("#operator-menu summary").click()
    page.locator("#operator-menu").get_by_role("link", name="Nodes").click()
    page.wait_for_url("**/ops/nodes/")

    form = page.locator("#register-node form")
    simulated_count = form.locator("input[name=new-simulated_gpu_count]")
    assert not simulated_count.is_visible(), "simulated GPUs are asked for only for the simulated runtime"
    form.locator("input[name=new-name]").fill("sim-01")
    form.locator("select[name=new-pool]").select_option("shared")
    form.locator("select[name=new-runtime]").select_option("simulated")
    simulated_count.fill("4")
    form.locator("textarea[name=new-labels]").fill("zone=a\nrack=r1")
    form.locator("button[type=submit]").click()
    page.locator("#messages").get_by_text("Node sim-01 registered.").wait_for()
    row = page.locator("#nodes tr[data-node=sim-01]")
    assert "simulated" in row.inner_text() and "Registered" in row.inner_text()

    row.get_by_role("link", name="sim-01").click()
    page.wait_for_url("**/ops/nodes/sim-01/")
    assert page.locator("#simulated-note").is_visible()
    assert "zone=a" in page.locator("#node-summary").inner_text()
    assert page.locator("#action-cordon").count() == 0, "a registered node cannot be cordoned"
    page.locator("#action-provision button[type=submit]").click()
    page.locator("#messages").get_by_text("Node sim-01: registered → provisioning.").wait_for()

    finish_provisioning(Node.objects.get(name="sim-01"), live_world)
    page.reload()
    assert page.locator("#node-state").inner_text().startswith("Ready")

    action = page.locator("#action-cordon")
    action.locator("button[type=submit]").click()
    error = action.locator(".field-error[data-field=reason]")
    error.wait_for()
    assert "Say why" in error.inner_text()
    assert Node.objects.get(name="sim-01").state == NodeState.READY

    page.locator("#action-cordon textarea[name=cordon-reason]").fill("fan noise, checking")
    page.locator("#action-cordon button[type=submit]").click()
    page.locator("#messages").get_by_text("Node sim-01: ready → cordoned.").wait_for()
    assert page.locator("#node-state").inner_text().startswith("Cordoned")
    assert "fan noise, checking" in page.locator("#node-state").inner_text()
    latest = page.locator("#node-events tbody tr").first.inner_text()
    assert "ready → cordoned" in latest and "fan noise, checking" in latest and "operator" in latest
    assert page.locator("#action-uncordon").is_visible()
    assert Node.objects.get(name="sim-01").state == NodeState.CORDONED


def test_deleting_a_pool_asks_first(live_world: World, page: Any) -> None:
    NodePool.objects.create(name="spare")
    log_in(page, "operator")
    page.wait_for_url("**/")
    page.goto("/ops/pools/")
    row = page.locator("#pools tr[data-pool=spare]")
    page.evaluate("window.notReloaded = true")
    page.once("dialog", lambda dialog: dialog.dismiss())
    row.get_by_role("button", name="Delete").click()
    page.wait_for_timeout(300)
    assert page.evaluate("window.notReloaded") is True, "dismissing the question sends nothing"
    assert NodePool.objects.filter(name="spare").exists()
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Delete").click()
    page.locator("#messages").get_by_text("Pool spare deleted.").wait_for()
    assert not NodePool.objects.filter(name="spare").exists()
