"""The pages of the live views: what the server renders before (and without) a socket.

The cluster heatmap is operators' only and reads the whole fleet in a fixed
number of queries; the workload and node pages carry the log viewer and the
GPU chart with the socket paths of their own object; the workload lists
subscribe to their tenant's events; every script and style is served from the
console itself.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.test import Client
from django.utils import timezone

from inventory.choices import NodeState
from inventory.models import Gpu, NodePool
from jobs import services
from jobs.models import LogChunk, Workload
from jobs.scheduler import shell
from tenants.context import Actor
from tests.conftest import World
from tests.frontend.test_node_pages import make_node
from tests.frontend.test_pages import logged_in
from tests.inventory.factories import make_node as make_ready_node
from tests.jobs.factories import assign, give_quota, request

CLUSTER = "/ops/cluster/"
FRONTEND = Path(__file__).resolve().parents[2] / "frontend"


def _cells(page: str) -> list[str]:
    return re.findall(r'data-gpu="([^"]+)"', page)


@pytest.mark.parametrize("username", ["admin_a", "member_a", "viewer_a", "admin_b"])
def test_the_cluster_page_does_not_exist_for_tenant_users(world: World, username: str) -> None:
    make_node(world, "n1", gpus=2)
    response = logged_in(username).get(CLUSTER)
    assert response.status_code == 404
    assert "GPU-n1" not in response.content.decode()
    assert 'href="/ops/cluster/"' not in logged_in(username).get("/t/tenant-a/").content.decode()


def test_anonymous_visitors_are_sent_to_log_in_from_the_cluster_page(world: World) -> None:
    response = Client().get(CLUSTER)
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")


def test_the_cluster_page_shows_every_gpu_by_pool_then_node(world: World) -> None:
    batch = NodePool.objects.create(name="batch")
    make_node(world, "b-node", gpus=2, pool=batch)
    make_node(world, "z-node", gpus=3)
    make_node(world, "a-node", gpus=1, state=NodeState.CORDONED)
    make_node(world, "empty")
    retired = make_node(world, "old", gpus=1, state=NodeState.REGISTERED)
    retired.state = NodeState.RETIRED
    retired.save(update_fields=["state"])
    Gpu.objects.filter(uuid="GPU-z-node-1").update(utilization=87.4, last_sample_at=timezone.now())
    # A figure from before the heartbeat timeout would read as current: it shows as "no sample".
    Gpu.objects.filter(uuid="GPU-z-node-2").update(utilization=55.0, last_sample_at=timezone.now() - timedelta(hours=1))

    client = logged_in("operator")
    page = client.get(CLUSTER).content.decode()
    assert 'href="/ops/cluster/"' in page, "the operator menu links the page"
    assert page.index('data-pool="batch"') < page.index('data-pool="shared"')
    shared = page.split('data-pool="shared"')[1]
    assert shared.index('data-node="a-node"') < shared.index('data-node="empty"') < shared.index('data-node="z-node"')
    assert _cells(page) == [
        "GPU-b-node-0",
        "GPU-b-node-1",
        "GPU-a-node-0",
        "GPU-z-node-0",
        "GPU-z-node-1",
        "GPU-z-node-2",
    ]
    assert "GPU-old-0" not in page and 'data-node="old"' not in page, "retired nodes are left out"
    busy = page.split('data-gpu="GPU-z-node-1"')[1].split("</i>")[0]
    assert 'style="--u:87"' in busy and 'title="GPU 1 · NVIDIA H100 80GB HBM3 · 87% utilization"' in busy
    stale = page.split('data-gpu="GPU-z-node-2"')
    assert 'class="hm-cell hm-none"' in stale[0].rsplit("<i", 1)[1] and "--u" not in stale[1].split("</i>")[0]
    assert "no recent sample" in stale[1].split("</i>")[0]
    cordoned = page.split('data-node="a-node"')[1].split("</div></div>")[0]
    assert 'class="state state-cordoned" data-node-state>Cordoned<' in cordoned
    assert 'data-ws="/ws/cluster/"' in page and "gpucloud/cluster.js" in page


def test_the_cluster_page_reads_in_a_fixed_number_of_queries(world: World, django_assert_num_queries: Any) -> None:
    client = logged_in("operator")
    make_node(world, "n0", gpus=8)
    with django_assert_num_queries(6) as few:  # session, user, then nodes, GPUs and their holders
        client.get(CLUSTER)
    for i in range(1, 30):
        make_node(world, f"n{i}", gpus=8, pool=NodePool.objects.get_or_create(name=f"pool-{i % 3}")[0])
    with django_assert_num_queries(len(few.captured_queries)):
        assert len(_cells(client.get(CLUSTER).content.decode())) == 240


def test_the_cluster_page_says_when_there_are_no_nodes(world: World) -> None:
    page = logged_in("operator").get(CLUSTER).content.decode()
    assert "No nodes yet" in page.split("data-heatmap-empty")[1] and _cells(page) == []


@pytest.fixture
def placed(world: World) -> Workload:
    """A 2-GPU job of member_a placed on n1's GPUs by a scheduling pass."""
    give_quota(world)
    make_ready_node(Actor(user=world.operator), world.pool, name="n1", gpus=4, cpu_cores=32, memory_mib=256_000)
    assign(world.member_a, world.project_a)
    workload = services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, gpus_per_replica=2)
    )
    assert shell.run_pass() is not None
    return Workload.all_tenants.get(pk=workload.pk)


def test_a_workload_page_has_the_log_viewer_and_the_chart_of_its_own_gpus(placed: Workload) -> None:
    page = logged_in("viewer_a").get(f"/t/tenant-a/workloads/{placed.pk}/").content.decode()
    log = page.split('id="log"')[1].split("</section>")[0]
    assert f'data-ws="/ws/workloads/{placed.pk}/logs/"' in log and "data-log-viewport" in log
    assert "No output yet." in log, "the server-rendered tail stays for pages without JavaScript"
    chart = page.split('id="gpu-chart"')[1]
    assert f'data-ws="/ws/workloads/{placed.pk}/metrics/"' in chart and 'data-scope="workload"' in chart
    held = page.split('id="gpu-chart-gpus" type="application/json">')[1].split("</script>")[0]
    assert held.count('"node": "n1"') == 2 and held.count("GPU-n1-") == 2
    assert "gpucloud/logview.js" in page and "gpucloud/gpuchart.js" in page and "vendor/uplot/uPlot.iife.min.js" in page
    assert 'data-workload-state="scheduled"' in page and 'id="workload-state-labels"' in page


def test_a_workload_that_never_held_gpus_has_no_chart(world: World) -> None:
    give_quota(world)
    make_node(world, "n1", gpus=1)
    assign(world.member_a, world.project_a)
    waiting = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    page = logged_in("member_a").get(f"/t/tenant-a/workloads/{waiting.pk}/").content.decode()
    assert 'id="gpu-chart"' not in page and "gpuchart.js" not in page and "uPlot" not in page
    assert f'data-ws="/ws/workloads/{waiting.pk}/logs/"' in page


def test_a_node_page_has_the_chart_of_its_gpus(world: World) -> None:
    make_node(world, "n1", gpus=2)
    make_node(world, "bare")
    client = logged_in("operator")
    page = client.get("/ops/nodes/n1/").content.decode()
    chart = page.split('id="gpu-chart"')[1]
    assert 'data-ws="/ws/nodes/n1/metrics/"' in chart and 'data-scope="node"' in chart
    assert "gpucloud/gpuchart.js" in page
    assert 'id="gpu-chart"' not in client.get("/ops/nodes/bare/").content.decode(), "no GPUs, no chart"


def test_the_workload_lists_subscribe_to_their_tenants_events(world: World) -> None:
    client = logged_in("viewer_a")
    workloads = client.get("/t/tenant-a/workloads/").content.decode()
    assert 'data-ws="/ws/t/tenant-a/events/"' in workloads and "gpucloud/liverows.js" in workloads
    filtered = client.get("/t/tenant-a/workloads/?project=alpha&state=pending").content.decode()
    assert 'data-ws="/ws/t/tenant-a/events/?project=alpha"' in filtered and 'data-filter-state="pending"' in filtered
    queue = client.get("/t/tenant-a/queue/").content.decode()
    assert 'data-ws="/ws/t/tenant-a/events/"' in queue and "gpucloud/liverows.js" in queue


def test_scripts_and_styles_come_from_the_console_itself() -> None:
    """GPU clusters are often air-gapped: no template or script of the console loads anything from elsewhere."""
    sources = [*FRONTEND.glob("templates/**/*.html"), *FRONTEND.glob("static/gpucloud/*.js")]
    assert len(sources) > 30
    for source in sources:
        text = source.read_text()
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), source
        assert not re.search(r"cdn\.|unpkg|jsdelivr|cdnjs|googleapis", text, re.IGNORECASE), source
        assert not re.search(r"""import\s[^;]*["'](https?:)?//""", text), source
    for vendored in ("vendor/uplot/uPlot.iife.min.js", "vendor/uplot/uPlot.min.css"):
        assert finders.find(vendored), f"{vendored} is missing: run `make assets`"


def test_the_viewers_download_link_works_with_the_browsers_session(placed: Workload) -> None:
    Workload.all_tenants.filter(pk=placed.pk).update(state="running", log_seq=2)
    now = timezone.now()
    LogChunk.all_tenants.create(
        tenant_id=placed.tenant_id,
        workload=placed,
        first_seq=1,
        last_seq=2,
        first_at=now,
        last_at=now,
        lines=[[1, now.isoformat(), "stdout", "first", 1, 0], [2, now.isoformat(), "stderr", "second", 1, 0]],
    )
    client = logged_in("viewer_a")
    page = client.get(f"/t/tenant-a/workloads/{placed.pk}/").content.decode()
    links = re.findall(r'href="([^"]+/logs/download/)" download>Download<', page)
    assert len(links) == 1
    response = client.get(links[0])
    assert response.status_code == 200
    body = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    assert "first" in body and "second" in body
    assert logged_in("admin_b").get(links[0]).status_code == 404, "another tenant finds nothing there"
