"""What the command-line client reads from the API: dry runs, launch steps and the notebook link, quota use."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inventory.models import Node
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Allocation, Workload
from jobs.services import images
from tenants.context import Actor
from tests.accounting.budget_factories import budget
from tests.conftest import World, client_for
from tests.jobs.factories import add_node, assign, give_quota, ready_world, run_pass_now
from tests.jobs.test_submission_rule_errors import _api_codes, _nothing_written

pytestmark = pytest.mark.django_db

BASE = "/api/v1/tenants/tenant-a/workloads/"
JOB = {"project": "alpha", "name": "train", "image": "registry.example.com/team/train:1.0", "pool": "shared"}
ITEM = {key: value for key, value in JOB.items() if key != "project"}  # a bulk item: the project is the body's


def _placeable(world: World) -> World:
    """The ready world, with CPU and memory on n1 so that passes place work there."""
    ready_world(world)
    Node.objects.filter(name="n1").update(cpu_cores=64, memory_mib=512_000)
    return world


def test_a_dry_run_accepts_what_a_submission_would_and_writes_nothing(world: World) -> None:
    ready_world(world)
    member = client_for(world.member_a)
    response = member.post(f"{BASE}validate/", JOB, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"valid": True, "count": 1, "budget_notes": []}
    bulk = member.post(f"{BASE}bulk/validate/", {"project": "alpha", "items": [ITEM, ITEM]}, format="json")
    assert bulk.json() == {"valid": True, "count": 2, "budget_notes": []}
    _nothing_written()
    assert member.post(BASE, JOB, format="json").status_code == 201  # and the submission itself goes through


def test_a_dry_run_says_how_much_of_each_budget_the_work_may_use(world: World) -> None:
    """As the launch page says it: the most GPU-hours the work may use against what remains of each budget in
    force over its project (its own, then its tenant's), from the runtime the submission would get."""
    ready_world(world)
    now = timezone.now()
    budget(world.tenant_a, world.project_a, amount="40", period="window", window_start=now - timedelta(days=1),
           window_end=now + timedelta(days=1))  # fmt: skip
    budget(world.tenant_a, None, unit="money", amount="500")
    member = client_for(world.member_a)
    job = {**JOB, "gpus_per_replica": 2, "max_runtime_seconds": 7200}
    item = {key: value for key, value in job.items() if key != "project"}
    notes = member.post(f"{BASE}validate/", job, format="json").json()["budget_notes"]
    assert notes[0].startswith(
        "This job may use up to 4.0 of your remaining 40.0 GPU-hours (project alpha's budget from"
    )
    assert notes[1] == "500.0 USD of the tenant tenant-a's budget this month remain."
    bulk = member.post(f"{BASE}bulk/validate/", {"project": "alpha", "items": [item, {**item, "replicas": 2}]},
                       format="json").json()  # fmt: skip
    assert bulk["budget_notes"][0].startswith("These 2 workloads may use up to 12.0 of your remaining 40.0")
    endless = member.post(f"{BASE}validate/", {**JOB, "kind": "notebook"}, format="json").json()["budget_notes"]
    assert endless[0].startswith("This job has no runtime limit: it may use all of your remaining 40.0 GPU-hours")
    _nothing_written()


def test_a_dry_run_names_every_rule_the_database_rules_included(world: World) -> None:
    give_quota(world, limit=2)
    add_node(world)
    assign(world.member_a, world.project_a)
    images.create_allowed_image(
        actor=Actor(user=world.operator), pattern="registry.example.com/team/*", tenant=world.tenant_a
    )
    member = client_for(world.member_a)
    bad = {**JOB, "name": "Bad_Name!", "image": "docker.io/evil:1", "gpus_per_replica": 4}
    assert _api_codes(member.post(f"{BASE}validate/", bad, format="json")) == {
        "name": "invalid_name",
        "image": "image_not_allowed",
        "gpus_per_replica": "above_quota_limit",
    }
    # A valid shape whose only fault is a database rule is refused too: the dry run runs the service's checks.
    assert _api_codes(member.post(f"{BASE}validate/", {**JOB, "gpus_per_replica": 3}, format="json")) == {
        "gpus_per_replica": "above_quota_limit"
    }
    items = [ITEM, {**ITEM, "gpus_per_replica": "lots"}, {**ITEM, "image": "docker.io/evil:1"}]
    assert _api_codes(member.post(f"{BASE}bulk/validate/", {"project": "alpha", "items": items}, format="json")) == {
        "items[1].gpus_per_replica": "invalid",
        "items[2].image": "image_not_allowed",
    }
    _nothing_written()


def test_a_dry_run_keeps_the_submission_access_rules(world: World) -> None:
    ready_world(world)
    assert client_for(world.viewer_a).post(f"{BASE}validate/", JOB, format="json").status_code == 403
    outsider = client_for(world.admin_b)
    assert outsider.post(f"{BASE}validate/", JOB, format="json").status_code == 404
    assert (
        outsider.post(f"{BASE}bulk/validate/", {"project": "alpha", "items": [ITEM]}, format="json").status_code == 404
    )


def test_the_detail_shows_the_launch_steps_of_the_current_attempt(world: World) -> None:
    _placeable(world)
    member = client_for(world.member_a)
    member.post(BASE, JOB, format="json")
    workload_id = member.post(BASE, {**JOB, "name": "big", "gpus_per_replica": 8}, format="json").json()["id"]
    run_pass_now()  # the first holds 1 of the project's 8: the second waits
    detail = member.get(f"{BASE}{workload_id}/").json()
    assert detail["state"] == "pending"
    steps = detail["launch_steps"]
    assert steps and steps[0]["status"] in {"done", "current"} and steps[0]["at"]
    assert [step["status"] for step in steps].count("current") == 1
    assert all(step["at"] is None for step in steps if step["status"] == "next")
    assert detail["notebook_url"] is None and detail["lab_path"] == ""


def _running_notebook(world: World) -> int:
    ready_world(world)
    response = client_for(world.member_a).post(BASE, {**JOB, "kind": "notebook", "name": "lab"}, format="json")
    workload_id: int = response.json()["id"]
    run_pass_now()
    Workload.all_tenants.filter(pk=workload_id).update(state=WorkloadState.RUNNING)
    return workload_id


def test_the_notebook_link_is_offered_to_whoever_the_proxy_lets_through(world: World) -> None:
    workload_id = _running_notebook(world)
    url = f"{BASE}{workload_id}/"
    # The console's hand-off, never a path the console would serve the notebook on.
    assert client_for(world.member_a).get(url).json()["notebook_url"] == f"/notebooks/{workload_id}/open"
    assert client_for(world.admin_a).get(url).json()["notebook_url"] == f"/notebooks/{workload_id}/open"
    assert client_for(world.viewer_a).get(url).json()["notebook_url"] is None
    assert client_for(world.admin_b).get(url).status_code == 404
    Workload.all_tenants.filter(pk=workload_id).update(lab_path="runs/exp 1.ipynb")
    link = client_for(world.member_a).get(url).json()["notebook_url"]
    assert link == f"/notebooks/{workload_id}/open?next=lab%2Ftree%2Fruns%2Fexp+1.ipynb"
    Workload.all_tenants.filter(pk=workload_id).update(state=WorkloadState.HIBERNATED)
    assert client_for(world.member_a).get(url).json()["notebook_url"] is None


def test_usage_shows_what_the_tenant_and_its_projects_hold_and_wait_for(world: World) -> None:
    _placeable(world)
    member = client_for(world.member_a)
    member.post(BASE, JOB, format="json")
    member.post(BASE, {**JOB, "name": "big", "gpus_per_replica": 8}, format="json")
    run_pass_now()
    assert Allocation.all_tenants.filter(released_at__isnull=True).count() == 1
    rows = member.get("/api/v1/tenants/tenant-a/usage/").json()["quotas"]
    tenant_row = {"project": None, "pool": "shared", "guaranteed": 8, "limit": 16, "in_use": 1}
    assert rows[0] == {**tenant_row, "borrowed": 0, "running": 1, "pending": 1}
    assert rows[1] == {
        "project": "alpha",
        "pool": "shared",
        "guaranteed": 0,
        "limit": 8,
        "in_use": 1,
        "borrowed": 1,
        "running": 1,
        "pending": 1,
    }
    # The other tenant sees none of it, and an outsider gets the tenant's 404.
    other = client_for(world.admin_b).get("/api/v1/tenants/tenant-b/usage/").json()["quotas"]
    assert other == []
    assert client_for(world.admin_b).get("/api/v1/tenants/tenant-a/usage/").status_code == 404
    assert Workload.all_tenants.filter(kind=WorkloadKind.JOB).count() == 2
