"""The live views in a real Chromium against the console under uvicorn (WebSockets included).

Everything that moves is driven through the real paths: log lines through
`ingest_log_batch`, GPU samples through the agent's `publish_samples` to its
node's group, state changes through `transition_workload`. The pages never
reload: a mark left on the window survives every update.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from inventory.agent.reporter import node_gpu_group
from inventory.agent.transport import publish_samples
from inventory.drivers.base import GpuSample
from jobs import services
from jobs.choices import WorkloadState
from jobs.models import Allocation, Replica, ReplicaState, Workload
from jobs.scheduler import shell
from jobs.services.execution import container_name
from jobs.services.lifecycle import release_allocations, transition_workload
from jobs.services.logs import ingest_log_batch
from tenants.context import Actor
from tenants.models import Membership
from tenants.scoping import tenant_scope
from tenants.services.members import remove_member
from tests.browser.conftest import wait_for_true
from tests.browser.test_console import log_in
from tests.conftest import World
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota, request

pytestmark = pytest.mark.browser

S = WorkloadState


class Log:
    """The output of replica 0 of a workload, shipped as the agent ships it: batches chained by cursor."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.cursor = ""

    def ship(self, texts: list[str], stream: str = "stdout") -> None:
        now = datetime.now(UTC).isoformat()
        cursor = uuid.uuid4().hex
        stored = ingest_log_batch(
            workload_id=self.workload.pk,
            attempt=1,
            replica=0,
            since=self.cursor,
            cursor=cursor,
            lines=[[now, stream, text] for text in texts],
        )
        assert stored == len(texts)
        self.cursor = cursor


@pytest.fixture
def running(live_world: World) -> Workload:
    """member_a's 2-GPU job, placed on n1 (4 GPUs) by a scheduling pass and running on it."""
    world = live_world
    give_quota(world)
    node = make_node(Actor(user=world.operator), world.pool, name="n1", gpus=4, cpu_cores=32, memory_mib=256_000)
    assign(world.member_a, world.project_a)
    workload = services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, gpus_per_replica=2)
    )
    assert shell.run_pass() is not None
    for source, target in ((S.SCHEDULED, S.STARTING), (S.STARTING, S.RUNNING)):
        assert transition_workload(workload_id=workload.pk, from_states=[source], to_state=target)
    Replica.all_tenants.create(
        tenant=world.tenant_a,
        workload=workload,
        attempt=1,
        index=0,
        node=node,
        name=container_name(workload.pk, 0, 1),
        state=ReplicaState.RUNNING,
    )
    return Workload.all_tenants.get(pk=workload.pk)


def open_live(page: Any, user: str, path: str, view: str) -> None:
    """Log `user` in, open `path`, wait until the live `view` got its first message, and mark the window."""
    log_in(page, user)
    page.wait_for_url(lambda url: "/login/" not in url)
    page.goto(path)
    page.locator(f"{view}[data-synced=true]").wait_for()
    assert page.locator(f"{view} [data-live-badge]").get_attribute("data-status") == "live"
    page.evaluate("window.notReloaded = true")


def publish_until(page: Any, node: str, samples: list[dict[str, Any]], condition: str) -> None:
    """Publish `samples` for `node` every 0.3 s, as its agent does every second, until `condition` holds on the page.

    A group's subscription may settle after the page's first message (Redis pub/sub), so a single
    publish could go unheard; the agent's next one is heard.
    """
    deadline = time.monotonic() + 10
    while True:
        publish_samples(node_gpu_group(node), samples)
        try:
            wait_for_true(page, condition, timeout=300)
            return
        except PlaywrightTimeout:
            assert time.monotonic() < deadline, f"never true: {condition}"


def not_reloaded(page: Any) -> bool:
    reloads = page.evaluate("performance.getEntriesByType('navigation').length")
    return bool(page.evaluate("window.notReloaded === true")) and reloads == 1


def sample(uuid: str, index: int, utilization: float) -> dict[str, Any]:
    """Return one GPU sample as the agent's reporter publishes it (a GpuSample as a dict)."""
    reading = GpuSample(
        uuid=uuid,
        index=index,
        timestamp=time.time(),
        utilization_gpu=utilization,
        memory_used_mib=4096 + index,
        memory_total_mib=81559,
        temperature_c=50.0,
        power_w=300.0,
    )
    return asdict(reading)


def test_new_log_lines_appear_within_a_second_and_a_reconnection_loses_none(running: Workload, live_page: Any) -> None:
    log = Log(running)
    log.ship([f"warm-up {i}" for i in range(3)])
    open_live(live_page, "member_a", f"/t/tenant-a/workloads/{running.pk}/", "#log")
    viewer = live_page.locator("#log")
    viewer.locator(".log-row", has_text="warm-up 2").wait_for()

    marker = f"epoch 1 loss 0.{uuid.uuid4().hex[:6]}"
    stored_at = time.monotonic()
    log.ship([marker], stream="stderr")
    viewer.locator(".log-row.log-stderr", has_text=marker).wait_for(timeout=5000)
    delay = time.monotonic() - stored_at
    assert delay < 1.0, f"the line took {delay:.2f} s to show"

    # The socket drops (a proxy restart): lines stored meanwhile arrive once it is back, none twice.
    live_page.evaluate("window.gpucloudLive[0].socket.close()")
    log.ship([f"while away {i}" for i in range(5)])
    viewer.locator(".log-row", has_text="while away 4").wait_for(timeout=10_000)
    log.ship(["back again"])
    viewer.locator(".log-row", has_text="back again").wait_for()
    seqs = [int(s) for s in viewer.locator(".log-row").evaluate_all("rows => rows.map(r => r.dataset.seq)")]
    assert seqs == list(range(1, 11)), seqs
    assert viewer.get_attribute("data-last-seq") == "10"

    # The state badge follows the workload, and so do its actions: an ended one offers Restart, not Stop.
    finished = "#workload-times tr:nth-child(4) td"  # Submitted, Scheduled, Started, Finished
    assert live_page.locator("#workload-times tr:nth-child(4) th").inner_text() == "Finished"
    assert live_page.locator(finished).inner_text().strip() == "—"
    assert live_page.locator("#allocations tr[data-held]").count() == 2, "both GPUs held while it runs"
    assert transition_workload(
        workload_id=running.pk, from_states=[S.RUNNING], to_state=S.SUCCEEDED, finished_at=datetime.now(UTC)
    )
    live_page.locator("[data-workload-state=succeeded]", has_text="Succeeded").wait_for(timeout=5000)
    live_page.locator("#action-restart").wait_for(timeout=5000)
    assert live_page.locator("#action-stop").count() == 0
    # The times and the timeline too, in the order things happened, the newest last.
    wait_for_true(live_page, f"document.querySelector(\"{finished}\").innerText.trim() !== '—'", timeout=5000)
    changes = live_page.locator("#timeline tbody tr td:nth-child(2)").all_inner_texts()
    assert changes[-3:] == ["Scheduled → Starting", "Starting → Running", "Running → Succeeded"], changes
    # Where it runs: its GPUs shown released once the controller frees them.
    release_allocations(workload_id=running.pk)
    live_page.locator("#allocations tr[data-held]").first.wait_for(state="detached", timeout=5000)
    assert live_page.locator("#allocations tbody tr").count() == 2, "released GPUs stay listed with when"
    assert not_reloaded(live_page)


def test_the_log_viewer_pauses_follows_and_searches(running: Workload, live_page: Any) -> None:
    log = Log(running)
    for start in range(0, 3000, 500):
        log.ship([f"line {n}" + (" needle" if n % 100 == 7 else "") for n in range(start, start + 500)])
    open_live(live_page, "member_a", f"/t/tenant-a/workloads/{running.pk}/", "#log")
    viewer = live_page.locator("#log")
    viewport = viewer.locator("[data-log-viewport]")
    viewer.locator(".log-row", has_text="line 2999").wait_for()
    assert viewer.get_attribute("data-lines") == "1000", "the viewer starts with the last 1000 lines"
    assert viewer.locator(".log-row").count() < 150, "only the rows in view are in the DOM"
    assert live_page.locator("#log [data-log-static]").is_hidden(), "the server-rendered tail gave way"

    # Scrolling up pauses following: new lines are counted, the view stays where it is.
    viewport.evaluate("v => { v.scrollTop = 0; }")
    wait_for_true(live_page, "document.querySelector('#log').dataset.following === 'false'")
    viewer.locator(".log-row", has_text="line 2000").wait_for()
    log.ship([f"late {i}" for i in range(5)])
    follow = viewer.locator("[data-log-follow]")
    follow.filter(has_text="5 new lines").wait_for()
    assert viewport.evaluate("v => v.scrollTop") == 0
    assert viewer.locator(".log-row", has_text="late 4").count() == 0
    follow.click()
    viewer.locator(".log-row", has_text="late 4").wait_for()
    assert follow.inner_text() == "Following"

    # Search: every match counted, next and previous go round them, the current one is marked.
    count = viewer.locator("[data-log-count]")
    viewer.locator("[data-log-search]").fill("NEEDLE")
    count.filter(has_text="10 matches").wait_for()
    viewer.locator("[data-log-search]").press("Enter")
    count.filter(has_text="1 of 10 matches").wait_for()
    current = viewer.locator(".log-row.log-current")
    assert current.inner_text() == "line 2007 needle" and current.locator("mark").inner_text() == "needle"
    viewer.locator("[data-log-next]").click()
    count.filter(has_text="2 of 10 matches").wait_for()
    assert viewer.locator(".log-row.log-current").inner_text() == "line 2107 needle"
    for _ in range(2):
        viewer.locator("[data-log-prev]").click()
    count.filter(has_text="10 of 10 matches").wait_for()
    assert viewer.locator(".log-row.log-current").inner_text() == "line 2907 needle"
    viewer.locator("[data-log-search]").fill("no such text")
    count.filter(has_text="no match").wait_for()
    assert viewer.locator("mark").count() == 0


def test_the_gpu_chart_receives_the_samples_of_the_workloads_own_gpus(running: Workload, live_page: Any) -> None:
    held = sorted(a.gpu.uuid for a in Allocation.all_tenants.filter(workload=running) if a.gpu is not None)
    assert len(held) == 2
    open_live(live_page, "member_a", f"/t/tenant-a/workloads/{running.pk}/", "#gpu-chart")
    chart = live_page.locator("#gpu-chart")
    assert chart.get_attribute("data-points") == "0"
    points = "Number(document.querySelector('#gpu-chart').dataset.points)"
    for second in range(3):
        # The agent publishes every GPU of the node; the page may only receive the workload's two.
        received = int(chart.get_attribute("data-points") or 0)
        readings = [sample(f"GPU-n1-{i}", i, 20.0 * i + second) for i in range(4)]
        publish_until(live_page, "n1", readings, f"{points} > {received}")
    live_page.wait_for_timeout(300)
    received = int(chart.get_attribute("data-points") or 0)
    assert received >= 6 and received % 2 == 0, "samples of GPUs the workload does not hold never arrive"
    # Away from the pointer, the legend reads each held GPU's latest utilization.
    legend = dict(
        chart.locator("[data-chart-util] .u-legend .u-series").evaluate_all(
            "rows => rows.map(r => [r.querySelector('.u-label').textContent, r.querySelector('.u-value').textContent])"
        )
    )
    indexes = [int(gpu.rsplit("-", 1)[1]) for gpu in held]
    assert {label: value for label, value in legend.items() if label != "Time"} == {
        f"GPU {index}": f"{20 * index + 2}%" for index in indexes
    }, legend
    assert chart.locator("[data-chart-util] canvas").count() == 1
    assert chart.locator("[data-chart-memory] canvas").count() == 1
    assert not_reloaded(live_page)


def test_a_pending_workloads_row_turns_running_without_a_reload(live_world: World, live_page: Any) -> None:
    world = live_world
    give_quota(world)
    make_node(Actor(user=world.operator), world.pool, name="n1", gpus=1, cpu_cores=32, memory_mib=256_000)
    assign(world.member_a, world.project_a)
    pending = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    open_live(live_page, "member_a", "/t/tenant-a/workloads/", "[data-live-rows]")
    state = live_page.locator(f'tr[data-workload="{pending.pk}"] .state')
    assert state.inner_text() == "Pending"

    assert shell.run_pass() is not None
    live_page.locator(f'tr[data-workload="{pending.pk}"] .state', has_text="Scheduled").wait_for()
    for source, target in ((S.SCHEDULED, S.STARTING), (S.STARTING, S.RUNNING)):
        assert transition_workload(workload_id=pending.pk, from_states=[source], to_state=target)
    live_page.locator(f'tr[data-workload="{pending.pk}"] .state', has_text="Running").wait_for(timeout=5000)
    assert "wstate-running" in (state.get_attribute("class") or "")

    # A workload submitted meanwhile is announced, not slipped in.
    later = services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, name="later")
    )
    live_page.locator("[data-new-workloads]", has_text="1 new workload").wait_for(timeout=5000)
    assert live_page.locator(f'tr[data-workload="{later.pk}"]').count() == 0
    assert not_reloaded(live_page)


def test_the_queue_moves_placed_work_and_drops_ended_work(live_world: World, live_page: Any) -> None:
    world = live_world
    give_quota(world)
    make_node(Actor(user=world.operator), world.pool, name="n1", gpus=1, cpu_cores=32, memory_mib=256_000)
    assign(world.member_a, world.project_a)
    first = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    open_live(live_page, "viewer_a", "/t/tenant-a/queue/", "[data-live-rows]")
    assert live_page.locator(f'#waiting tr[data-workload="{first.pk}"]').count() == 1

    assert shell.run_pass() is not None
    live_page.locator(f'#active tr[data-workload="{first.pk}"] .state', has_text="Scheduled").wait_for(timeout=5000)
    assert live_page.locator(f'#waiting tr[data-workload="{first.pk}"]').count() == 0
    assert live_page.locator("#waiting tr[data-empty]").is_visible(), "nothing waits any more"
    services.cancel_workload(actor=Actor(user=world.member_a), workload=Workload.all_tenants.get(pk=first.pk))
    live_page.locator(f'tr[data-workload="{first.pk}"]').wait_for(state="detached", timeout=5000)
    assert not_reloaded(live_page)


def test_a_heatmap_cell_changes_colour_with_its_gpus_utilization(live_world: World, live_page: Any) -> None:
    world = live_world
    make_node(Actor(user=world.operator), world.pool, name="n1", gpus=2)
    open_live(live_page, "operator", "/ops/cluster/", "#heatmap")
    cell = live_page.locator('[data-gpu="GPU-n1-1"]')
    assert "hm-none" in (cell.get_attribute("class") or ""), "no sample yet"

    colours = []
    for utilization in (5.0, 95.0):
        readings = [sample("GPU-n1-0", 0, 50.0), sample("GPU-n1-1", 1, utilization)]
        shown = f"document.querySelector('[data-gpu=\"GPU-n1-1\"]').dataset.util === '{int(utilization)}'"
        publish_until(live_page, "n1", readings, shown)
        colours.append(cell.evaluate("c => getComputedStyle(c).backgroundColor"))
    assert colours[0] != colours[1], colours
    cell.hover()
    assert "GPU 1" in (cell.get_attribute("title") or "") and "95% utilization" in (cell.get_attribute("title") or "")
    assert not_reloaded(live_page)


def test_a_member_removed_while_watching_sees_the_log_close(
    live_world: World, running: Workload, live_page: Any
) -> None:
    log = Log(running)
    log.ship(["before"])
    open_live(live_page, "member_a", f"/t/tenant-a/workloads/{running.pk}/", "#log")
    membership = Membership.all_tenants.get(user=live_world.member_a, tenant=live_world.tenant_a)
    with tenant_scope(live_world.tenant_a):
        remove_member(actor=Actor(user=live_world.admin_a), membership=membership)
    removed_at = time.monotonic()
    badge = live_page.locator("#log [data-live-badge][data-status=refused]")
    badge.wait_for(timeout=5000)
    assert time.monotonic() - removed_at < 5 and badge.inner_text() == "closed: access revoked"
    log.ship(["after the removal"])
    live_page.wait_for_timeout(500)
    assert live_page.locator(".log-row", has_text="after the removal").count() == 0
    assert not_reloaded(live_page), "the page stays as it was, without reconnecting"


def test_a_long_log_keeps_the_dom_small_and_memory_capped(running: Workload, live_page: Any) -> None:
    """112,000 lines through the viewer's message handler: a handful of rows in the DOM, the oldest past the cap go."""
    open_live(live_page, "member_a", f"/t/tenant-a/workloads/{running.pk}/", "#log")
    live_page.evaluate(
        """() => {
        const live = window.gpucloudLive.find((socket) => socket.path().includes("/logs/"));
        for (let page = 0; page < 112; page++) {
          const lines = [];
          for (let i = 1; i <= 1000; i++) {
            const seq = page * 1000 + i;
            lines.push([seq, "2026-01-01T00:00:00Z", "stdout", `step ${seq}`, 1, 0]);
          }
          live.onmessage({ type: "lines", lines });
        }
      }"""
    )
    viewer = live_page.locator("#log")
    viewer.locator(".log-row", has_text="step 112000").wait_for()
    # The cap (100,000) is enforced a tenth at a time, so trimming is one slice now and then.
    kept = int(viewer.get_attribute("data-lines") or 0)
    assert 100_000 <= kept <= 110_000, kept
    assert viewer.locator(".log-row").count() < 150
    assert "keeps about the last 100,000 lines" in viewer.locator("[data-log-notice]").inner_text()
    viewer.locator("[data-log-viewport]").evaluate("v => { v.scrollTop = 0; }")
    oldest = 112_000 - kept + 1
    viewer.locator(f'.log-row[data-seq="{oldest}"]').wait_for()
    assert viewer.locator(".log-row").first.inner_text() == f"step {oldest}"


def test_a_nodes_chart_receives_the_samples_of_every_gpu(live_world: World, live_page: Any) -> None:
    make_node(Actor(user=live_world.operator), live_world.pool, name="n1", gpus=3)
    open_live(live_page, "operator", "/ops/nodes/n1/", "#gpu-chart")
    points = "Number(document.querySelector('#gpu-chart').dataset.points)"
    readings = [sample(f"GPU-n1-{i}", i, 30.0 + i) for i in range(3)]
    publish_until(live_page, "n1", readings, f"{points} >= 3")
    series = live_page.locator("#gpu-chart [data-chart-memory] .u-legend .u-series .u-label").all_inner_texts()
    assert series == ["Time", "GPU 0", "GPU 1", "GPU 2"]
