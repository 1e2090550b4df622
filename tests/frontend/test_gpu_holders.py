"""Allocation beside utilization, for operators: the heatmap and a node's GPU table name each GPU's holder
(tenant, project, workload) and mark GPUs a running workload holds but leaves idle; the live heatmap
hears of placements and releases; the home page is an operator's start page."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.utils import timezone

from frontend.consumers import cluster as cluster_stream
from frontend.heatmap import cluster_heatmap
from inventory.models import Gpu, Node
from jobs.choices import WorkloadState
from jobs.models import Workload
from jobs.services import release_allocations, transition_workload
from tests.conftest import World
from tests.frontend import live
from tests.frontend.live import open_stream, receive, session_headers
from tests.frontend.test_live_streams import _placeable, _submit
from tests.frontend.test_pages import logged_in
from tests.jobs.factories import add_node, run_pass_now

fresh_live_layer = live.fresh_live_layer


def _running(world: World, gpus: int = 2) -> Workload:
    """A `gpus`-GPU job of member_a placed on n1 by a pass and running."""
    _placeable(world)
    workload = _submit(world, gpus)
    run_pass_now()
    workload.refresh_from_db()
    for state in (WorkloadState.STARTING, WorkloadState.RUNNING):
        assert transition_workload(workload_id=workload.pk, from_states=[workload.state], to_state=state)
        workload.state = state
    return Workload.all_tenants.get(pk=workload.pk)


def _held(workload: Workload) -> list[Gpu]:
    return list(Gpu.objects.filter(allocations__workload=workload, allocations__released_at__isnull=True))


def _sample(gpu: Gpu, utilization: float) -> None:
    Gpu.objects.filter(pk=gpu.pk).update(utilization=utilization, last_sample_at=timezone.now())


def _cell(page: str, uuid: str) -> str:
    return (
        page.split(f'data-gpu="{uuid}"')[0].rsplit("<i ", 1)[1] + page.split(f'data-gpu="{uuid}"')[1].split("</i>")[0]
    )


def test_the_heatmap_names_each_gpus_holder_and_marks_the_idle_ones(world: World) -> None:
    workload = _running(world)
    busy, idle = _held(workload)
    _sample(busy, 60.0)
    _sample(idle, 2.0)
    free = Gpu.objects.exclude(pk__in=[busy.pk, idle.pk]).first()
    assert free is not None
    _sample(free, 1.0)

    page = logged_in("operator").get("/ops/cluster/").content.decode()
    label = f"tenant-a / alpha / train ({WorkloadState.RUNNING})"
    held = _cell(page, busy.uuid)
    assert "hm-held" in held and f'data-w="{workload.pk}"' in held and label in held and "hm-idle" not in held
    quiet = _cell(page, idle.uuid)
    assert "hm-held hm-idle" in quiet and "allocated but idle" in quiet
    unheld = _cell(page, free.uuid)
    assert "hm-held" not in unheld and "hm-idle" not in unheld, "a free GPU is never idle-but-allocated"
    totals = page.split('id="heatmap-totals"')[1].split("</p>")[0]
    for figure, name in ((8, "gpus"), (2, "held"), (1, "idle")):
        assert f'data-total="{name}"' in totals and f">{figure}</strong>" in totals.split(f'data-total="{name}"')[1]
    holders = json.loads(page.split('id="heatmap-holders" type="application/json">')[1].split("</script>")[0])
    assert holders == {
        str(workload.pk): {
            "tenant": "tenant-a",
            "project": "alpha",
            "name": "train",
            "owner": "member_a",
            "state": "running",
        }
    }
    assert 'data-node="n1" data-state="ready" data-sim' in page and ">sim</span>" in page, "simulated, plainly"
    assert 'data-workload-url="/t/__tenant__/workloads/0/"' in page


def test_a_starting_workloads_gpus_are_not_called_idle(world: World) -> None:
    _placeable(world)
    workload = _submit(world, 1)
    run_pass_now()
    (gpu,) = _held(Workload.all_tenants.get(pk=workload.pk))
    _sample(gpu, 0.0)
    (cell,) = [g for p in cluster_heatmap().pools for n in p.nodes for g in n.gpus if g.uuid == gpu.uuid]
    assert cell.holder is not None and cell.holder.state == WorkloadState.SCHEDULED and not cell.idle


def test_a_nodes_gpu_table_says_which_workload_holds_each_gpu(world: World) -> None:
    workload = _running(world)
    busy, idle = _held(workload)
    _sample(busy, 75.0)
    _sample(idle, 0.0)
    page = logged_in("operator").get("/ops/nodes/n1/").content.decode()
    table = page.split('id="node-gpus"')[1].split("</table>")[0]
    rows = {row.split('"')[0]: row for row in table.split('<tr data-gpu="')[1:]}
    assert f'href="/t/tenant-a/workloads/{workload.pk}/">train</a>' in rows[busy.uuid]
    assert "tenant-a</a> / " in rows[busy.uuid] and ">alpha</a>" in rows[busy.uuid] and "75%" in rows[busy.uuid]
    assert "idle</span>" in rows[idle.uuid] and "idle</span>" not in rows[busy.uuid]
    assert sum("free</span>" in row for row in rows.values()) == 6
    assert 'id="simulated-note"' in page


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_live_layer")
def test_the_cluster_stream_tells_of_placements_at_once_and_releases_within_the_refresh(
    world: World, monkeypatch: Any
) -> None:
    monkeypatch.setattr(cluster_stream, "HOLDERS_REFRESH_SECONDS", 1.5)
    _placeable(world)
    add_node(world, "n2", gpus=1)
    headers = session_headers(world.operator)

    async def scenario() -> None:
        stream, _, _ = await open_stream("/ws/cluster/", headers=headers)
        layout = await receive(stream)
        assert [node["simulated"] for node in layout["nodes"]] == [True, True]
        first = await receive(stream)
        assert first == {"type": "holders", "workloads": {}, "nodes": {"n1": [None] * 8, "n2": [None]}}
        workload = await database_sync_to_async(_submit)(world, 2)
        await database_sync_to_async(run_pass_now)()
        placed = await receive(stream, timeout=3)
        assert placed["type"] == "holders" and list(placed["nodes"]) == ["n1"], "only the node that changed"
        assert sum(pk == workload.pk for pk in placed["nodes"]["n1"]) == 2
        assert placed["workloads"][str(workload.pk)]["state"] == WorkloadState.SCHEDULED
        await database_sync_to_async(_release)(workload.pk)
        released = await receive(stream, timeout=4)
        assert released == {"type": "holders", "workloads": {}, "nodes": {"n1": [None] * 8}}
        await stream.disconnect()

    async_to_sync(scenario)()


def _release(workload_id: int) -> None:
    assert transition_workload(
        workload_id=workload_id, from_states=[WorkloadState.SCHEDULED], to_state=WorkloadState.CANCELLED
    )
    assert release_allocations(workload_id=workload_id) == 2


def test_an_operator_without_a_tenant_gets_the_start_page(db: None) -> None:
    from django.contrib.auth.models import User

    from tests.conftest import PASSWORD

    User.objects.create_user("root", password=PASSWORD, is_staff=True)
    page = logged_in("root").get("/").content.decode()
    assert "Ask a tenant admin" not in page and "Operator start" in page
    steps = page.split('id="start-steps"')[1].split("</ol>")[0]
    for step, link in (
        ("pool", "/ops/pools/"),
        ("nodes", "/ops/nodes/"),
        ("tenant", "#create-tenant"),
    ):
        assert f'href="{link}"' in steps.split(f'data-step="{step}"')[1].split("</li>")[0], step
    assert "Create a tenant first." in steps.split('data-step="quota"')[1]
    assert 'class="badge badge-ok"' not in steps, "nothing is done yet"
    assert 'id="fleet-glance"' in page and 'href="/ops/cluster/"' in page


def test_the_start_page_follows_the_setup_and_points_at_the_tenant_that_needs_it(world: World) -> None:
    _running(world)
    page = logged_in("operator").get("/").content.decode()
    steps = page.split('id="start-steps"')[1].split("</ol>")[0]
    # Tenant B has an admin (admin_b) but no quota: its quota is the step left.
    assert 'href="/t/tenant-b/quotas/"' in steps.split('data-step="quota"')[1].split("</li>")[0]
    assert steps.split('data-step="admin"')[0].rsplit("<li", 1)[1].startswith(' class="done"')
    glance = page.split('id="fleet-glance"')[1].split("</section>")[0]
    assert "<strong>8</strong><small>GPUs" in glance and "<strong>2</strong><small>allocated" in glance
    assert Node.objects.filter(runtime="simulated").count() == 1 and "1 simulated" in glance
