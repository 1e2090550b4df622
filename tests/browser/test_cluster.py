"""The cluster heatmap in a real Chromium: holders beside utilization, idle holders marked, placements
shown live, a GPU's details with links, grouping by tenant and zoom."""

from __future__ import annotations

from typing import Any

import pytest

from inventory.models import Gpu
from jobs import services
from jobs.choices import WorkloadState
from jobs.models import Workload
from jobs.scheduler import shell
from jobs.services.lifecycle import transition_workload
from tenants.context import Actor
from tests.browser.conftest import wait_for_true
from tests.browser.test_live import not_reloaded, open_live, publish_until, sample
from tests.conftest import World
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota, request

pytestmark = pytest.mark.browser


def _placed(world: World, name: str, gpus: int) -> Workload:
    workload = services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, name=name, gpus_per_replica=gpus)
    )
    assert shell.run_pass() is not None
    return Workload.all_tenants.get(pk=workload.pk)


def _run(workload: Workload) -> None:
    for before, after in (
        (WorkloadState.SCHEDULED, WorkloadState.STARTING),
        (WorkloadState.STARTING, WorkloadState.RUNNING),
    ):
        assert transition_workload(workload_id=workload.pk, from_states=[before], to_state=after)


def _count(page: Any, selector: str, expected: int) -> None:
    wait_for_true(page, f"document.querySelectorAll({selector!r}).length === {expected}", timeout=5000)


def test_the_heatmap_shows_holders_live_marks_idle_ones_and_regroups_by_tenant(
    live_world: World, live_page: Any
) -> None:
    world = live_world
    give_quota(world)
    make_node(Actor(user=world.operator), world.pool, name="n1", gpus=4, cpu_cores=32, memory_mib=256_000)
    assign(world.member_a, world.project_a)
    first = _placed(world, "first", 1)
    _run(first)
    (held,) = Gpu.objects.filter(allocations__workload=first).values_list("uuid", flat=True)

    open_live(live_page, "operator", "/ops/cluster/", "#heatmap")
    cell = live_page.locator(f'[data-gpu="{held}"]')
    assert "hm-held" in (cell.get_attribute("class") or "")
    assert live_page.locator("[data-node=n1] [data-node-sim]").inner_text() == "sim", "simulated, said so"

    readings = [sample(f"GPU-n1-{i}", i, 1.0 if f"GPU-n1-{i}" == held else 50.0) for i in range(4)]
    publish_until(
        live_page, "n1", readings, f"document.querySelector('[data-gpu=\"{held}\"]').classList.contains('hm-idle')"
    )
    assert live_page.locator("[data-total=idle]").inner_text() == "1"
    assert live_page.locator(".hm-nodes .hm-idle").count() == 1, "only the held GPU that idles, not the free ones"

    second = _placed(world, "second", 2)
    _count(live_page, ".hm-nodes .hm-held", 3)
    assert live_page.locator("[data-total=held]").inner_text() == "3"

    cell.click()
    detail = live_page.locator("[data-heatmap-detail]")
    assert "tenant-a / alpha / first (running, member_a)" in detail.inner_text()
    assert "allocated but idle" in detail.inner_text()
    link = detail.get_by_role("button", name="Open workload first")
    assert link.get_attribute("href") == f"/t/tenant-a/workloads/{first.pk}/"
    assert detail.get_by_role("button", name="Open node n1").get_attribute("href") == "/ops/nodes/n1/"

    live_page.locator("[data-heatmap-group]").select_option("tenant")
    assert live_page.locator("[data-heatmap-tenants] [data-tenant=tenant-a] .hm-cell").count() == 3
    assert live_page.locator("[data-heatmap-tenants] [data-tenant=''] h3").inner_text().startswith("Not allocated")
    assert live_page.locator("[data-heatmap-tenants] [data-tenant=''] .hm-cell").count() == 1
    assert not live_page.locator("[data-heatmap-pools]").is_visible()

    live_page.locator("[data-heatmap-zoom]").fill("30")
    assert cell.evaluate("c => c.getBoundingClientRect().width") == 30
    assert cell.evaluate("c => getComputedStyle(c, '::after').content") == '"1"', "big cells show their reading"
    live_page.locator("[data-heatmap-group]").select_option("pool")
    assert live_page.locator("[data-node=n1] .hm-cell").count() == 4, "every cell back in its node"
    assert second.pk != first.pk and not_reloaded(live_page)
