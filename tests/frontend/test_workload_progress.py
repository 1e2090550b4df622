"""A workload's page shows how far its launch got, reasons in words, its timeline in order, and simulated nodes.

The steps are driven through the real services a launch goes through —
submission, a scheduling pass, `launch_workload`, the agent's reports of a
started replica and of Jupyter answering — and read back from the page and
from its live parts (`?part=live`, what the page's script fetches when the
events stream says the workload changed). Personas: member_a owns the
notebook; viewer_a reads; admin_b, of another tenant, gets 404.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobs import services
from jobs.choices import ReasonCode, WorkloadKind, WorkloadState
from jobs.models import Replica, Workload, WorkloadEvent
from jobs.scheduler import shell
from jobs.selectors import capacity_due, reason_label
from jobs.services.execution import launch_workload
from jobs.services.lifecycle import transition_workload
from jobs.services.replicas import record_replica_ready, record_replica_started
from tenants.context import Actor
from tenants.models import ProjectQuota
from tests.conftest import World
from tests.frontend.test_pages import logged_in
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota, request


@pytest.fixture
def team(world: World) -> World:
    """Alpha has an 8-GPU quota and one ready simulated 8-GPU node; member_a is on alpha."""
    give_quota(world)
    make_node(Actor(user=world.operator), world.pool, name="n1", gpus=8, cpu_cores=64, memory_mib=512_000)
    assign(world.member_a, world.project_a)
    return world


def _notebook(world: World, **overrides: Any) -> Workload:
    data = request(world, name="nb", kind=WorkloadKind.NOTEBOOK, **overrides)
    return services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=data)


def _steps(html: str) -> dict[str, str]:
    """Return {step key: status} of the launch steps in `html`, in page order."""
    found = re.findall(r'data-step="([a-z]+)" data-status="([a-z]+)"', html)
    return dict(found)


def _live(workload: Workload, user: str = "member_a") -> str:
    response = logged_in(user).get(f"/t/tenant-a/workloads/{workload.pk}/?part=live")
    assert response.status_code == 200
    return response.content.decode()


def test_a_notebooks_launch_steps_follow_what_really_happened_each_with_its_time(team: World) -> None:
    notebook = _notebook(team)
    assert _steps(_live(notebook)) == {
        "queued": "current",
        "placed": "next",
        "starting": "next",
        "jupyter": "next",
        "ready": "next",
    }
    assert 'id="open-notebook" disabled' in _live(notebook), "the button is there, inactive until Jupyter answers"

    assert shell.run_pass() is not None
    live = _live(notebook)
    assert _steps(live)["placed"] == "current" and "Placed on node n1" in live and "1 GPU (NVIDIA H100" in live

    assert launch_workload(workload=Workload.all_tenants.get(pk=notebook.pk)) == 1
    live = _live(notebook)
    assert _steps(live)["starting"] == "current" and "Starting a simulated run" in live

    replica = Replica.all_tenants.get(workload=notebook)
    assert record_replica_started(workload_id=notebook.pk, attempt=1, replica=0, handle={}, endpoint="http://x")
    live = _live(notebook)
    assert _steps(live)["jupyter"] == "current", "started, but Jupyter has not answered yet"
    assert Workload.all_tenants.get(pk=notebook.pk).state == WorkloadState.STARTING

    assert record_replica_ready(workload_id=notebook.pk, attempt=1, replica=0)
    live = _live(notebook)
    assert _steps(live) == {
        "queued": "done",
        "placed": "done",
        "starting": "done",
        "jupyter": "done",
        "ready": "current",
    }
    assert f'href="/notebooks/{notebook.pk}/open"' in live and "data-open-lab" in live
    replica.refresh_from_db()
    steps = live.split('id="launch-steps"')[1].split("</section>")[0]
    stamps = re.findall(r'<time datetime="([^"]+)"', steps)
    assert len(stamps) == 5, "every reached step says when"
    assert stamps == sorted(stamps), stamps


def test_a_waiting_workload_says_its_place_and_reason_in_words_with_the_code_in_the_title(team: World) -> None:
    services.submit_workload(
        actor=Actor(user=team.member_a), project=team.project_a, data=request(team, name="big", gpus_per_replica=8)
    )
    waiting = services.submit_workload(
        actor=Actor(user=team.member_a), project=team.project_a, data=request(team, name="more", gpus_per_replica=2)
    )
    assert shell.run_pass() is not None
    waiting.refresh_from_db()
    assert waiting.state == WorkloadState.PENDING and waiting.reason_code
    label = reason_label(waiting.reason_code)
    assert label != waiting.reason_code
    title = f'title="{waiting.reason_code}"'
    for path in (f"/t/tenant-a/workloads/{waiting.pk}/", "/t/tenant-a/queue/", "/t/tenant-a/workloads/"):
        page = logged_in("member_a").get(path).content.decode()
        assert title in page and label in page, path
        assert f"<code>{waiting.reason_code}</code>" not in page, f"{path} shows the raw code"
    steps = _live(waiting)
    assert "position 1 in pool shared" in steps


def test_the_expected_start_is_when_running_work_in_the_pool_reaches_its_maximum_runtime(team: World) -> None:
    now = timezone.now()
    assert capacity_due(team.pool.pk, now=now) is None
    bounded = services.submit_workload(
        actor=Actor(user=team.member_a),
        project=team.project_a,
        data=request(team, name="bounded", gpus_per_replica=8, max_runtime_seconds=3600),
    )
    assert shell.run_pass() is not None
    started = now - timedelta(minutes=10)
    Workload.all_tenants.filter(pk=bounded.pk).update(state=WorkloadState.RUNNING, started_at=started)
    assert capacity_due(team.pool.pk, now=now) == started + timedelta(seconds=3600)

    # A workload waiting for room in that pool (not for quota) is told by when, at the latest, on its page.
    ProjectQuota.all_tenants.filter(project=team.project_a).update(limit=16)
    waiting = services.submit_workload(
        actor=Actor(user=team.member_a), project=team.project_a, data=request(team, name="next", gpus_per_replica=2)
    )
    assert shell.run_pass() is not None
    assert Workload.all_tenants.get(pk=waiting.pk).reason_code == ReasonCode.NO_CAPACITY
    due = started + timedelta(seconds=3600)
    steps = _live(waiting)
    expected = steps.split("data-expected-start>")[1].split("</small>")[0]
    assert f"Expected to start by {due:%H:%M} UTC at the latest" in expected, expected
    assert "<code>shared</code> reaches its maximum runtime" in expected


def test_the_timeline_lists_events_in_the_order_they_happened_in_words(team: World) -> None:
    notebook = _notebook(team)
    submitted = WorkloadEvent.all_tenants.get(workload=notebook)
    # A pass stamps its events with the moment it began, which can precede a submission that committed
    # while it read: the timeline follows the order events were written, not their stamps.
    assert shell.run_pass(now=submitted.created_at - timedelta(milliseconds=5)) is not None
    html = _live(notebook)
    timeline = html.split('id="timeline"')[1]
    assert timeline.index("Pending</td>") < timeline.index("Pending → Scheduled"), timeline


def test_a_workload_on_a_simulated_node_says_so_on_its_page_and_above_its_log(team: World) -> None:
    job = services.submit_workload(actor=Actor(user=team.member_a), project=team.project_a, data=request(team))
    page = logged_in("viewer_a").get(f"/t/tenant-a/workloads/{job.pk}/").content.decode()
    assert 'id="simulated-note"' not in page, "not placed yet: nothing to say"
    assert shell.run_pass() is not None
    page = logged_in("viewer_a").get(f"/t/tenant-a/workloads/{job.pk}/").content.decode()
    assert 'id="simulated-note"' in page and "simulated node" in page
    assert 'id="log-simulated"' in page and "Simulated output" in page
    listed = logged_in("viewer_a").get("/t/tenant-a/workloads/").content.decode()
    row = listed.split(f'data-workload="{job.pk}"')[1].split("</tr>")[0]
    assert 'class="badge badge-sim"' in row, "the list says so too"


def test_a_real_node_shows_no_simulated_note(team: World) -> None:
    make_node(Actor(user=team.operator), team.pool, name="real", gpus=0, runtime="process")
    job = services.submit_workload(actor=Actor(user=team.member_a), project=team.project_a, data=request(team))
    transition_workload(workload_id=job.pk, from_states=[WorkloadState.PENDING], to_state=WorkloadState.CANCELLED)
    page = logged_in("member_a").get(f"/t/tenant-a/workloads/{job.pk}/").content.decode()
    assert "simulated-note" not in page and "log-simulated" not in page
    listed = logged_in("member_a").get("/t/tenant-a/workloads/").content.decode()
    assert "badge-sim" not in listed.split(f'data-workload="{job.pk}"')[1].split("</tr>")[0]
    assert reason_label(ReasonCode.QUOTA_LIMIT) == "Quota limit reached"


def test_the_live_parts_answer_as_the_page_does_404_to_another_tenant(team: World) -> None:
    notebook = _notebook(team)
    assert logged_in("admin_b").get(f"/t/tenant-a/workloads/{notebook.pk}/?part=live").status_code == 404
    viewer = _live(notebook, "viewer_a")
    assert "launch-steps" in viewer and 'id="open-notebook"' not in viewer, "only its owner and admins may open it"
