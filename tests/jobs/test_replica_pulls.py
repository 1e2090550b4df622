"""The controller's side of an image pull: the agent's reports recorded, the pull step shown, the row sent live.

Driven through the real services of a launch (submission, a scheduling
pass, `launch_workload`) and the reports an agent sends
(`record_replica_pulling`, `record_replica_started`), read back from the
workload page's live parts as a person sees them. A pull's reports may
arrive twice, late or out of order (the controller's workers take reports
in parallel): none moves the page back. The Docker runtime's real pull is
tests/jobs/test_pull_docker.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async

from jobs import services
from jobs.choices import WorkloadKind
from jobs.models import Replica, Workload, WorkloadEvent
from jobs.scheduler import shell
from jobs.services.execution import launch_workload
from jobs.services.replicas import record_replica_pulling, record_replica_started
from tenants.context import Actor
from tests.conftest import World
from tests.frontend import live
from tests.frontend.live import open_stream, receive, session_headers
from tests.frontend.test_pages import logged_in
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota, request

IMAGE = "registry.example.com/team/lab:2"
MB = 1_000_000
fresh_live_layer = live.fresh_live_layer


@pytest.fixture
def launched(world: World) -> Workload:
    """A notebook of member_a placed on Docker node d1 and launched there (its replica is launching)."""
    give_quota(world)
    operator = Actor(user=world.operator)
    make_node(operator, world.pool, name="d1", gpus=1, runtime="docker", cpu_cores=8, memory_mib=64_000)
    assign(world.member_a, world.project_a)
    data = request(world, name="nb", kind=WorkloadKind.NOTEBOOK, image=IMAGE)
    notebook = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=data)
    assert shell.run_pass() is not None
    assert launch_workload(workload=Workload.all_tenants.get(pk=notebook.pk)) == 1
    return Workload.all_tenants.get(pk=notebook.pk)


def _progress(seconds: float, done_mb: int, *, began_at: float = 1000.0, done: bool = False, **extra: Any) -> dict:
    layers_done = 2 if done else 1
    return {
        "image": IMAGE,
        "began_at": began_at,
        "seconds": seconds,
        "layers_done": layers_done,
        "layers_total": 2,
        "bytes_done": done_mb * MB,
        "bytes_total": 4 * MB,
        "done": done,
        **extra,
    }


def _pulling(workload: Workload, progress: dict) -> bool:
    return record_replica_pulling(workload_id=workload.pk, attempt=1, replica=0, progress=progress)


def _started(workload: Workload) -> bool:
    return record_replica_started(workload_id=workload.pk, attempt=1, replica=0, handle={}, endpoint="http://x")


def _page(workload: Workload, user: str = "member_a") -> str:
    response = logged_in(user).get(f"/t/tenant-a/workloads/{workload.pk}/?part=live")
    assert response.status_code == 200
    return response.content.decode()


def _steps(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-step="([a-z]+)" data-status="([a-z]+)"', html))


def _step_text(html: str, key: str) -> str:
    item = html.split(f'data-step="{key}"')[1].split("</li>")[0]
    return " ".join(re.sub(r"<[^>]+>", " ", item).split())


def test_a_pull_shows_as_its_own_step_between_placed_and_starting_and_ends_when_the_last_report_says(
    launched: Workload,
) -> None:
    page = _page(launched)
    assert "pulling" not in _steps(page), "no step for a pull nobody reported"
    assert _steps(page)["starting"] == "current"

    assert _pulling(launched, _progress(0.0, 0))
    assert _pulling(launched, _progress(1.0, 1))
    page = _page(launched)
    assert list(_steps(page)) == ["queued", "placed", "pulling", "starting", "jupyter", "ready"]
    assert _steps(page)["pulling"] == "current" and _steps(page)["starting"] == "next"
    assert f"Pulling image {IMAGE}" in page
    assert "1.0 MB of 4.0 MB, 1 of 2 layers" in _step_text(page, "pulling")
    assert f"Pulling image {IMAGE}" in _page(launched, "viewer_a"), "the project's viewer sees it too"
    outsider = logged_in("admin_b").get(f"/t/tenant-a/workloads/{launched.pk}/?part=live")
    assert outsider.status_code == 404

    assert not _pulling(launched, _progress(0.5, 0)), "an older report of the same pull changes nothing"
    assert not _pulling(launched, _progress(1.0, 1)), "nor does the same report twice"
    assert "1.0 MB of 4.0 MB" in _step_text(_page(launched), "pulling")

    assert _pulling(launched, _progress(2.25, 3))
    assert _pulling(launched, _progress(2.25, 4, done=True)), "the last report, taken in the same millisecond"
    assert not _pulling(launched, _progress(2.25, 4, done=True)), "a repeated last report changes nothing"
    assert not _pulling(launched, _progress(3.0, 4)), "the pull is over"
    page = _page(launched)
    assert (_steps(page)["pulling"], _steps(page)["starting"]) == ("done", "current")
    assert "pulled in 2.2 s (4.0 MB)" in _step_text(page, "pulling")
    pulled = WorkloadEvent.all_tenants.filter(workload=launched, kind="workload.image_pulled")
    assert [e.message for e in pulled] == [f"Node d1 pulled image {IMAGE} in 2.2 s, 4.0 MB."]
    assert "pulled image" in page, "the timeline says it too"

    assert _started(launched)
    page = _page(launched)
    assert _steps(page) == {
        "queued": "done",
        "placed": "done",
        "pulling": "done",
        "starting": "done",
        "jupyter": "current",
        "ready": "next",
    }
    replica = Replica.all_tenants.get(workload=launched)
    assert replica.pull_started_at is not None and replica.pull_finished_at is not None
    assert replica.created_at <= replica.pull_started_at <= replica.pull_finished_at <= replica.started_at  # type: ignore[operator]
    stamps = re.findall(r'<time datetime="([^"]+)"', page.split('id="launch-steps"')[1].split("</section>")[0])
    assert len(stamps) == 5 and stamps == sorted(stamps), stamps


def test_a_late_progress_report_never_moves_a_started_replica_back_and_a_late_last_one_still_ends_the_pull(
    launched: Workload,
) -> None:
    assert _pulling(launched, _progress(0.0, 0))
    assert _started(launched), "the start report overtook the pull's last reports"
    page = _page(launched)
    assert (_steps(page)["pulling"], _steps(page)["starting"], _steps(page)["jupyter"]) == ("done", "done", "current")

    assert not _pulling(launched, _progress(1.0, 2)), "progress after the start is stale"
    replica = Replica.all_tenants.get(workload=launched)
    assert replica.pull_progress["bytes_done"] == 0 and replica.pull_finished_at is None

    assert _pulling(launched, _progress(1.5, 4, done=True))
    replica.refresh_from_db()
    assert replica.pull_finished_at is not None and replica.started_at is not None
    assert replica.pull_finished_at <= replica.started_at, "the pull ended before the start it came with"
    assert _steps(_page(launched))["jupyter"] == "current"


def test_a_retried_start_pulls_anew_and_its_reports_count_though_their_clock_restarts(launched: Workload) -> None:
    assert _pulling(launched, _progress(110.0, 3, began_at=1000.0))
    assert _pulling(launched, _progress(1.0, 1, began_at=1130.0)), "a new pull (the start timed out and was retried)"
    assert not _pulling(launched, _progress(111.0, 3, began_at=1000.0)), "the earlier pull's late report"
    assert "1.0 MB of 4.0 MB" in _step_text(_page(launched), "pulling")


def test_what_a_node_reports_is_bounded_before_it_is_stored(launched: Workload) -> None:
    garbage = {"image": "x" * 5000, "began_at": float("nan"), "seconds": -5, "bytes_done": "lots", "done": "yes"}
    garbage |= {"layers_done": 10**30, "layers_total": -3, "bytes_total": 2.5e6}
    assert _pulling(launched, garbage)
    stored = Replica.all_tenants.get(workload=launched).pull_progress
    assert stored == {
        "image": "x" * 300,
        "began_at": 0.0,
        "seconds": 0.0,
        "layers_done": 2**53,
        "layers_total": 0,
        "bytes_done": 0,
        "bytes_total": 2_500_000,
        "done": False,
    }


def test_a_report_about_a_replica_nobody_launched_is_dropped(launched: Workload) -> None:
    assert not record_replica_pulling(workload_id=launched.pk, attempt=2, replica=0, progress=_progress(1.0, 1))
    assert not record_replica_pulling(workload_id=launched.pk + 999, attempt=1, replica=0, progress=_progress(1, 1))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_live_layer")
def test_each_pull_report_sends_the_workloads_row_on_its_tenants_events_stream(
    world: World, launched: Workload
) -> None:
    headers = session_headers(world.member_a)

    async def scenario() -> None:
        stream, _, _ = await open_stream("/ws/t/tenant-a/events/?project=alpha", headers=headers)
        snapshot = await receive(stream)
        assert [row["id"] for row in snapshot["workloads"]] == [launched.pk]
        for seconds in (0.0, 1.0):
            assert await database_sync_to_async(_pulling)(launched, _progress(seconds, int(seconds)))
            message = await receive(stream)
            assert (message["type"], message["id"], message["state"]) == ("workload", launched.pk, "starting")
        assert not await database_sync_to_async(_pulling)(launched, _progress(0.5, 0))
        assert await stream.receive_nothing(timeout=0.5), "a report that changed nothing is not announced"
        await stream.disconnect()

    async_to_sync(scenario)()
