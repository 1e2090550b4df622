"""A notebook whose image the Docker node lacks: the node pulls it, and its page shows the pull as it happens.

End to end through the real parts: submission, a scheduling pass, the
agent in this process with the Docker runtime (pulling on), a private
registry on 127.0.0.1 (tests/jobs/registry.py) behind a link slow enough
that the pull takes about two seconds, the agent's `jobs.replica_pulling`
reports through the in-process Celery worker, and the workload page's live
part as its owner's browser fetches it. Busybox httpd stands in for
Jupyter (same base URL, port and status URL), as in test_execution_docker.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from inventory.agent import executor as executor_module
from inventory.agent.config import AgentConfig, activate
from inventory.drivers.docker import DockerRuntime
from inventory.models import agent_queue_for
from jobs.choices import WorkloadState
from jobs.models import Replica, Workload, WorkloadEvent
from tests.conftest import World
from tests.frontend.test_pages import logged_in
from tests.jobs.factories import run_pass_now
from tests.jobs.registry import Registry, running_registry, slow_image_of
from tests.jobs.test_execution_docker import HTTPD, NODE, _reached, _submit, _world
from tests.workers import running_worker, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.django_db(transaction=True)]
MB = 1024 * 1024


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with running_registry(tmp_path) as serving:
        yield serving


@pytest.fixture
def slow_image(registry: Registry, test_image: str) -> Iterator[str]:
    """A 4 MB image the engine does not have, reached through a link passing 2 MB a second."""
    with slow_image_of(registry, test_image) as ref:
        yield ref


@pytest.fixture
def pulling_agent(tmp_path: Path, test_image: str) -> Iterator[AgentConfig]:
    """The agent of the Docker node in this process, pulling missing images; removes this test's containers."""
    config = AgentConfig(node=NODE, work_dir=tmp_path, pull_images=True, probe="simulated")
    activate(config)
    executor_module._executor = executor_module.Executor(config)
    _ids_apart()
    with running_worker(["control", "ingest", agent_queue_for(NODE)], concurrency=4):
        yield config
    executor_module._executor = None
    runtime = DockerRuntime()
    mine = {str(pk) for pk in Workload.all_tenants.values_list("pk", flat=True)}
    for managed in runtime.list_managed():
        if managed.tenant == "tenant-a" and managed.workload_id in mine:
            runtime.remove(managed.handle)


def _ids_apart() -> None:
    """Number this test's workloads from a random high id: container names derive from it, and other test
    runs use the same Docker engine at the same time."""
    start = random.randint(10**6, 10**9)  # not a secret: only apart from other runs
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("INSERT OR REPLACE INTO sqlite_sequence (name, seq) VALUES ('jobs_workload', %s)", [start])
        else:
            cursor.execute("SELECT setval(pg_get_serial_sequence('jobs_workload', 'id'), %s)", [start])


def _page(workload: Workload) -> str:
    response = logged_in("member_a").get(f"/t/tenant-a/workloads/{workload.pk}/?part=live")
    assert response.status_code == 200
    return response.content.decode()


def _steps(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-step="([a-z]+)" data-status="([a-z]+)"', html))


def _step_text(html: str, key: str) -> str:
    if f'data-step="{key}"' not in html:
        return ""
    item = html.split(f'data-step="{key}"')[1].split("</li>")[0]
    return " ".join(re.sub(r"<[^>]+>", " ", item).split())


def test_a_notebooks_page_shows_the_image_pull_with_its_progress_then_the_rest_of_the_launch(
    world: World, pulling_agent: AgentConfig, slow_image: str
) -> None:
    _world(world)
    notebook = _submit(world, slow_image, HTTPD, kind="notebook", name="pulled")
    seen: list[str] = []

    def pulling_with_bytes() -> bool:
        page = _page(notebook)
        text = _step_text(page, "pulling")
        seen.append(f"{_steps(page).get('pulling')}: {text}")
        return _steps(page).get("pulling") == "current" and bool(re.search(r"[0-9.]+ [kM]B of 4\.2 MB", text))

    run_pass_now()
    assert wait_until(pulling_with_bytes, timeout=20, interval=0.1), seen
    during = _page(notebook)
    assert f"Pulling image {slow_image}" in during
    assert list(_steps(during)) == ["queued", "placed", "pulling", "starting", "jupyter", "ready"]
    assert _steps(during)["starting"] == "next"

    _reached(notebook, WorkloadState.RUNNING, timeout=60)
    after = _page(notebook)
    assert _steps(after) == {
        "queued": "done",
        "placed": "done",
        "pulling": "done",
        "starting": "done",
        "jupyter": "done",
        "ready": "current",
    }
    assert re.search(r"pulled in [0-9.]+ s \(4\.2 MB\)", _step_text(after, "pulling")), _step_text(after, "pulling")
    replica = Replica.all_tenants.get(workload=notebook)
    progress = replica.pull_progress
    assert progress["done"] and progress["image"] == slow_image
    assert (progress["layers_done"], progress["layers_total"]) == (2, 2)
    assert progress["bytes_done"] == progress["bytes_total"] >= 4 * MB
    assert progress["seconds"] >= 1.0, "the link passes 2 MB a second"
    assert replica.pull_started_at <= replica.pull_finished_at <= replica.started_at  # type: ignore[operator]
    events = WorkloadEvent.all_tenants.filter(workload=notebook, kind="workload.image_pulled")
    assert [e.message.split(" in ")[0] for e in events] == [f"Node {NODE} pulled image {slow_image}"]
