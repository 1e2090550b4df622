"""The queue page (why work waits, where it runs, GPU use by project) and the operators' allocation page."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from jobs.models import Workload, WorkloadEvent
from jobs.scheduler import shell
from tenants.context import Actor
from tenants.models import Project, ProjectQuota
from tests.conftest import World
from tests.frontend.test_pages import logged_in
from tests.inventory.factories import make_node


def _workload(world: World, name: str, gpus: int, project: Project | None = None) -> Workload:
    project = project or world.project_a
    return Workload.all_tenants.create(
        tenant=project.tenant,
        project=project,
        owner=world.member_a if project.tenant_id == world.tenant_a.pk else world.admin_b,
        name=name,
        image="registry.example.com/train:1",
        gpus_per_replica=gpus,
        pool=world.pool,
    )


def _cluster(world: World) -> tuple[Workload, Workload]:
    ProjectQuota.all_tenants.create(
        tenant=world.tenant_a, project=world.project_a, pool=world.pool, guaranteed=2, limit=2
    )
    make_node(Actor(user=world.operator), world.pool, name="n1", gpus=4, cpu_cores=32, memory_mib=256_000)
    running, waiting = _workload(world, "big", 2), _workload(world, "later", 1)
    assert shell.run_pass() is not None
    return running, waiting


def test_the_queue_shows_why_work_waits_and_where_it_runs(world: World) -> None:
    running, waiting = _cluster(world)
    for username in ("viewer_a", "member_a", "admin_a"):
        page = logged_in(username).get("/t/tenant-a/queue/").content.decode()
        row = page.split(f'data-workload="{waiting.pk}"')[1].split("</tr>")[0]
        assert "QUOTA_LIMIT" in row and "Project alpha already uses 2 of its limit of 2 GPUs" in row
        assert "<td>1</td>" in row, "its queue position"
        placed = page.split(f'data-workload="{running.pk}"')[1].split("</tr>")[0]
        assert "n1/gpu" in placed and "Scheduled" in placed
        use = " ".join(page.split('data-project="alpha"')[1].split("</tr>")[0].split())
        assert "<td>2</td><td>2</td><td>0</td><td>2</td>" in use, "in use, guaranteed, borrowed, limit"


def test_another_tenants_queue_is_not_found(world: World) -> None:
    _cluster(world)
    assert logged_in("admin_b").get("/t/tenant-a/queue/").status_code == 404
    assert "later" not in logged_in("admin_b").get("/t/tenant-b/queue/").content.decode()


def test_operators_see_allocation_per_pool_and_tenant(world: World) -> None:
    _cluster(world)
    page = logged_in("operator").get("/ops/allocation/").content.decode()
    row = " ".join(page.split('data-tenant="tenant-a"')[1].split("</tr>")[0].split())
    assert "<td>2</td><td>8</td><td>16</td>" in row, "in use, guaranteed, limit"
    assert logged_in("admin_a").get("/ops/allocation/").status_code in (403, 404)


def test_the_queue_page_uses_a_bounded_number_of_queries(world: World, django_assert_max_num_queries: Any) -> None:
    _cluster(world)
    for i in range(20):
        _workload(world, f"extra{i}", 1)
    shell.run_pass()
    client = logged_in("member_a")
    with django_assert_max_num_queries(12):  # the recent preemptions are one query, the projects' counts one
        assert client.get("/t/tenant-a/queue/").content.decode().count("data-workload=") == 22


def test_the_queue_page_says_what_each_preemption_cost_and_only_the_tenants_own(world: World) -> None:
    from jobs.models import WorkloadEvent

    mine = _workload(world, "mine", 1)
    theirs = Workload.all_tenants.create(
        tenant=world.tenant_b, project=world.project_b, owner=world.admin_b, name="theirs", image="x", pool=world.pool
    )
    for workload, cost in ((mine, "It loses 20 GPU-minutes of work"), (theirs, "It loses 99 GPU-minutes of work")):
        WorkloadEvent.all_tenants.create(
            tenant_id=workload.tenant_id,
            workload=workload,
            kind="workload.state_changed",
            from_state="running",
            to_state="preempted",
            reason_code="RECLAIM_GUARANTEE",
            message=f"Preempted. {cost} since its last checkpoint.",
        )
    table = logged_in("member_a").get("/t/tenant-a/queue/").content.decode().split('id="preemptions"')[1]
    assert "It loses 20 GPU-minutes of work" in table and f"#{mine.pk}" in table
    assert "99 GPU-minutes" not in table and "theirs" not in table


def test_the_queue_says_when_waiting_work_should_start_and_what_is_reserved(world: World) -> None:
    _, waiting = _cluster(world)
    start = timezone.now() + timedelta(hours=2, minutes=1)
    Workload.all_tenants.filter(pk=waiting.pk).update(
        estimated_start_at=start,
        estimate_basis="When workload 7 ends, as predicted from its history.",
        predicted_runtime_seconds=5400,
        reserved_from=start,
        reserved_gpus=[{"node": "n1", "gpus": ["GPU-x", "GPU-y"]}],
    )

    page = logged_in("viewer_a").get("/t/tenant-a/queue/").content.decode()

    row = page.split('id="waiting"')[1].split(f'data-workload="{waiting.pk}"')[1].split("</tr>")[0]
    assert "starts in about 2 h" in row and "When workload 7 ends, as predicted from its history." in row
    assert "runs about 2 h" in row, "its predicted run time"
    reserved = page.split('id="reservations"')[1].split(f'data-workload="{waiting.pk}"')[1].split("</tr>")[0]
    assert "<code" in reserved and "n1</code> <small>2 GPUs</small>" in reserved and "in about 2 h" in reserved
    assert "Nothing is reserved" in logged_in("admin_b").get("/t/tenant-b/queue/").content.decode()


def test_the_queue_shows_what_each_preemption_cost(world: World) -> None:
    _, waiting = _cluster(world)
    WorkloadEvent.all_tenants.create(
        tenant=world.tenant_a,
        workload=waiting,
        kind="workload.state_changed",
        from_state="running",
        to_state="preempted",
        reason_code="RECLAIM_GUARANTEE",
        message="Preempted: ... It loses 1.5 GPU-hours of work. Restarting costs another 2 GPU-minutes.",
        lost_gpu_seconds=5400,
        overhead_gpu_seconds=120,
    )

    page = logged_in("member_a").get("/t/tenant-a/queue/").content.decode()

    row = page.split('id="preemptions"')[1].split(f'data-workload="{waiting.pk}"')[1].split("</tr>")[0]
    assert "<td data-lost>1.5 GPU-h</td><td data-overhead>0.03 GPU-h</td>" in row


def test_a_waiting_workloads_page_says_when_it_should_start(world: World) -> None:
    _, waiting = _cluster(world)
    Workload.all_tenants.filter(pk=waiting.pk).update(
        estimated_start_at=timezone.now() + timedelta(minutes=45, seconds=20),
        estimate_basis="Assumes running work ends when predicted.",
        predicted_runtime_seconds=600,
        prediction_basis="Median of the last 3 succeeded runs of the same owner, image and GPU shape.",
    )

    page = logged_in("member_a").get(f"/t/tenant-a/workloads/{waiting.pk}/").content.decode()

    why = page.split('id="why-pending"')[1].split("</article>")[0]
    assert "It starts in about 45 min" in why and "Assumes running work ends when predicted." in why
    assert "Expected to run about 10 min: median of the last 3" in why
