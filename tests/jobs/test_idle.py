"""Idle notebook reclaim: GPU samples and Jupyter activity on a controlled clock; warning, extension, stop."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from common.protocol.messages import StopReplica
from inventory.models import Gpu, GpuMinute
from jobs import dispatch
from jobs.choices import ReasonCode, WorkloadKind, WorkloadState
from jobs.jupyter import JupyterActivity, JupyterClient, JupyterUnavailable
from jobs.models import Allocation, Replica, ReplicaState, Workload, WorkloadEvent
from jobs.services import check_idle_notebooks
from jobs.services.execution import container_name
from jobs.services.idle import idle_timeout_seconds
from tenants.models import Membership, Tenant
from tests.conftest import PASSWORD, World, client_for
from tests.jobs.factories import add_node

pytestmark = pytest.mark.django_db

T0 = datetime(2025, 1, 1, 0, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
EXTEND = "/api/v1/tenants/tenant-a/workloads/{pk}/extend/"


@pytest.fixture(autouse=True)
def _idle_settings(settings: Any) -> None:
    settings.NOTEBOOK_IDLE_TIMEOUT_SECONDS = 3600
    settings.NOTEBOOK_IDLE_WARNING_SECONDS = 600
    settings.NOTEBOOK_IDLE_UTILIZATION = 5


@dataclass
class FakeJupyter:
    """A scripted activity source: an answer (or an error to raise) per workload, and the calls it got."""

    answers: dict[int, JupyterActivity | Exception] = field(default_factory=dict)
    calls: list[tuple[str, int, str]] = field(default_factory=list)

    def activity(self, *, endpoint: str, workload_id: int, token: str) -> JupyterActivity:
        self.calls.append((endpoint, workload_id, token))
        answer = self.answers.get(workload_id, JupyterActivity(None, kernels=0, busy_kernels=0, connections=0))
        if isinstance(answer, Exception):
            raise answer
        return answer


def _notebook(world: World, *, started: datetime = T0, owner: User | None = None, **fields: Any) -> Workload:
    """A running notebook started at `started` holding GPU 0 of node n1 (utilization unknown), Jupyter on replica 0."""
    node = add_node(world, "n1", gpus=2)
    workload = Workload.all_tenants.create(
        tenant=world.tenant_a,
        project=world.project_a,
        owner=owner or world.member_a,
        kind=WorkloadKind.NOTEBOOK,
        name="explore",
        image="registry.example.com/jupyter:1",
        pool=world.pool,
        state=WorkloadState.RUNNING,
        started_at=started,
        session_secret="s3cret",
        **fields,
    )
    gpu = node.gpus.get(index=0)
    Allocation.all_tenants.create(tenant=world.tenant_a, workload=workload, replica=0, node=node, gpu=gpu)
    Replica.all_tenants.create(
        tenant=world.tenant_a,
        workload=workload,
        attempt=1,
        index=0,
        node=node,
        name=container_name(workload.pk, 0, 1),
        state=ReplicaState.RUNNING,
        endpoint="http://10.0.0.5:31000",
    )
    return workload


def _utilization(workload: Workload, percent: float) -> None:
    Gpu.objects.filter(allocations__workload=workload).update(utilization=percent)


def _check(at: datetime, jupyter: FakeJupyter | None = None) -> dict[str, int]:
    return check_idle_notebooks(now=at, source=jupyter or FakeJupyter())


def _reload(workload: Workload) -> Workload:
    return Workload.all_tenants.get(pk=workload.pk)


def _events(workload: Workload, kind: str) -> list[str]:
    return list(WorkloadEvent.all_tenants.filter(workload=workload, kind=kind).values_list("message", flat=True))


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, dict[str, Any]]]:
    """Messages the controller sends (to the agents) instead of a broker."""
    messages: list[tuple[str, str, dict[str, Any]]] = []
    monkeypatch.setattr(dispatch.app, "send_task", lambda name, kwargs, queue: messages.append((name, queue, kwargs)))
    return messages


# --- activity -------------------------------------------------------------------------------


def test_a_busy_gpu_keeps_the_notebook_alive(world: World) -> None:
    notebook = _notebook(world)
    _utilization(notebook, 5)  # at the threshold counts as use
    for hours in (1, 2, 3):
        assert _check(T0 + timedelta(hours=hours))["active"] == 1
    current = _reload(notebook)
    assert (current.state, current.last_activity_at, current.idle_warned_at) == (
        "running",
        T0 + timedelta(hours=3),
        None,
    )
    _utilization(notebook, 4.9)
    assert _check(T0 + timedelta(hours=3) + 49 * MINUTE)["active"] == 1
    assert _check(T0 + timedelta(hours=3) + 50 * MINUTE)["warned"] == 1


def test_a_busy_kernel_keeps_the_notebook_alive(world: World) -> None:
    notebook = _notebook(world)
    _utilization(notebook, 0)
    busy = FakeJupyter({notebook.pk: JupyterActivity(T0, kernels=2, busy_kernels=1, connections=0)})
    assert _check(T0 + timedelta(hours=2), busy) == {"checked": 1, "unreachable": 0, "active": 1}
    assert _reload(notebook).last_activity_at == T0 + timedelta(hours=2)
    assert busy.calls == [("http://10.0.0.5:31000", notebook.pk, "s3cret")]


def test_jupyter_activity_moves_the_idle_clock_but_an_open_tab_does_not(world: World) -> None:
    notebook = _notebook(world)
    typed = FakeJupyter({notebook.pk: JupyterActivity(T0 + 30 * MINUTE, kernels=1, busy_kernels=0, connections=3)})
    assert _check(T0 + 70 * MINUTE, typed)["active"] == 1
    assert _reload(notebook).last_activity_at == T0 + 30 * MINUTE
    assert _check(T0 + 80 * MINUTE, typed)["warned"] == 1, "3 open connections but nothing done for 50 minutes"


def test_activity_reported_from_a_clock_ahead_counts_as_now(world: World) -> None:
    notebook = _notebook(world)
    ahead = FakeJupyter(
        {notebook.pk: JupyterActivity(T0 + timedelta(days=1), kernels=0, busy_kernels=0, connections=0)}
    )
    _check(T0 + 10 * MINUTE, ahead)
    assert _reload(notebook).last_activity_at == T0 + 10 * MINUTE


def _busy_minute(workload: Workload, minute: datetime, *, peak: float, average: float = 1.0) -> None:
    """Roll up one minute of the notebook's GPU: `average` utilization over 60 samples, peaking at `peak`."""
    gpu = Gpu.objects.get(allocations__workload=workload)
    GpuMinute.objects.create(gpu=gpu, minute=minute, samples=60, utilization_sum=60 * average, utilization_max=peak)


def _taken_at(workload: Workload, at: datetime) -> None:
    Allocation.all_tenants.filter(workload=workload).update(created_at=at)


def test_a_burst_between_two_checks_keeps_the_notebook_alive(world: World, settings: Any) -> None:
    """The latest sample says idle, but a rollup minute of the last two peaked at the threshold."""
    settings.TELEMETRY_IDLE_WINDOW_SECONDS = 120
    notebook = _notebook(world)
    _taken_at(notebook, T0)
    _utilization(notebook, 0)
    _busy_minute(notebook, T0 + 48 * MINUTE, peak=5.0)
    assert _check(T0 + 50 * MINUTE + timedelta(seconds=10))["active"] == 1, "minute 48 is inside [48, 50:10]"
    assert _reload(notebook).last_activity_at == T0 + 50 * MINUTE + timedelta(seconds=10)
    assert _check(T0 + 51 * MINUTE)["active"] == 1, "idle for 50 seconds only"
    assert _reload(notebook).last_activity_at == T0 + 50 * MINUTE + timedelta(seconds=10), "minute 48 is too old"
    settings.TELEMETRY_IDLE_WINDOW_SECONDS = 3600
    assert _check(T0 + 90 * MINUTE)["active"] == 1, "a wider window reaches back to minute 48"
    assert _check(T0 + 140 * MINUTE)["warned"] == 1, "idle since 90, minute 48 long out of the window"


def test_a_low_peak_or_a_previous_holders_burst_does_not_count(world: World) -> None:
    notebook = _notebook(world)
    _taken_at(notebook, T0 + 49 * MINUTE + timedelta(seconds=30))
    _utilization(notebook, 0)
    _busy_minute(notebook, T0 + 48 * MINUTE, peak=100.0, average=100.0)  # before it took the GPU
    _busy_minute(notebook, T0 + 49 * MINUTE, peak=4.9)  # the minute it took it on counts, but stayed low
    _busy_minute(notebook, T0 + 51 * MINUTE, peak=100.0)  # stamped after the check by a clock ahead
    assert _check(T0 + 50 * MINUTE)["warned"] == 1
    _busy_minute(notebook, T0 + 50 * MINUTE, peak=30.0, average=0.5)  # a short burst: the peak counts, not the mean
    assert _check(T0 + 50 * MINUTE + timedelta(seconds=30))["active"] == 1


# --- warning and stop -----------------------------------------------------------------------


def test_warned_at_timeout_minus_warning_then_stopped_at_timeout(
    world: World, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    notebook = _notebook(world)
    assert _check(T0 + 49 * MINUTE)["active"] == 1
    assert _check(T0 + 50 * MINUTE)["warned"] == 1
    assert _events(notebook, "workload.idle_warning") == [
        "Idle for 50 minutes: this notebook will be hibernated at 01:00 UTC unless you extend it or use it. "
        "Its files stay in your home; resume it any time from its page."
    ]
    assert _reload(notebook).idle_warned_at == T0 + 50 * MINUTE
    assert _check(T0 + 59 * MINUTE)["warned"] == 1
    assert len(_events(notebook, "workload.idle_warning")) == 1, "warned once"
    with django_capture_on_commit_callbacks(execute=True):
        assert _check(T0 + 60 * MINUTE)["stopped"] == 1
    stopped = _reload(notebook)
    assert (stopped.state, stopped.reason_code) == (WorkloadState.HIBERNATED, ReasonCode.IDLE)
    assert (
        stopped.reason_message == "Hibernated after 60 minutes idle: no GPU use at or above 5% and no notebook "
        "activity. Its GPU is free; Resume brings it back with its files."
    )
    assert [(name, kwargs["name"]) for name, _, kwargs in sent] == [
        (StopReplica.TASK, container_name(notebook.pk, 0, 1))
    ]
    assert _check(T0 + 61 * MINUTE) == {"checked": 0}


def test_activity_after_a_warning_clears_it(world: World) -> None:
    notebook = _notebook(world)
    _check(T0 + 50 * MINUTE)
    back = FakeJupyter({notebook.pk: JupyterActivity(T0 + 55 * MINUTE, kernels=1, busy_kernels=0, connections=1)})
    assert _check(T0 + 56 * MINUTE, back)["active"] == 1
    current = _reload(notebook)
    assert (current.idle_warned_at, current.last_activity_at) == (None, T0 + 55 * MINUTE)
    assert _events(notebook, "workload.idle_warning_cleared") == ["Activity seen: the idle stop is called off."]
    assert _check(T0 + 61 * MINUTE)["active"] == 1
    assert _check(T0 + 105 * MINUTE)["warned"] == 1, "warned again after 50 more idle minutes"


def test_a_late_check_warns_first_and_keeps_the_time_it_announces(world: World) -> None:
    """The controller was down past the deadline: the owner still gets the whole warning period."""
    notebook = _notebook(world)
    assert _check(T0 + 90 * MINUTE)["warned"] == 1
    assert _events(notebook, "workload.idle_warning") == [
        "Idle for 90 minutes: this notebook will be hibernated at 01:40 UTC unless you extend it or use it. "
        "Its files stay in your home; resume it any time from its page."
    ]
    assert _check(T0 + 99 * MINUTE)["warned"] == 1
    assert _check(T0 + 100 * MINUTE)["stopped"] == 1


def test_an_unreachable_jupyter_leaves_the_gpu_to_decide(world: World) -> None:
    idle = _notebook(world)
    down = FakeJupyter({idle.pk: JupyterUnavailable("connection refused")})
    assert _check(T0 + 50 * MINUTE, down) == {"checked": 1, "unreachable": 1, "warned": 1}
    _utilization(idle, 90)
    assert _check(T0 + 70 * MINUTE, down)["active"] == 1, "a working GPU keeps it alive though Jupyter is silent"
    assert _reload(idle).state == WorkloadState.RUNNING


def test_only_running_notebooks_are_checked(world: World) -> None:
    notebook = _notebook(world)
    Workload.all_tenants.filter(pk=notebook.pk).update(kind=WorkloadKind.JOB)
    assert _check(T0 + timedelta(days=1)) == {"checked": 0}
    Workload.all_tenants.filter(pk=notebook.pk).update(kind=WorkloadKind.NOTEBOOK, state=WorkloadState.STARTING)
    assert _check(T0 + timedelta(days=1)) == {"checked": 0}


def test_the_timeout_is_the_notebooks_else_the_tenants_else_the_platforms(world: World) -> None:
    notebook = _notebook(world)
    assert idle_timeout_seconds(_reload_with_tenant(notebook)) == 3600
    Tenant.objects.filter(pk=world.tenant_a.pk).update(notebook_idle_timeout_seconds=1800)
    assert idle_timeout_seconds(_reload_with_tenant(notebook)) == 1800
    Workload.all_tenants.filter(pk=notebook.pk).update(idle_timeout_seconds=7200)
    assert idle_timeout_seconds(_reload_with_tenant(notebook)) == 7200
    assert _check(T0 + 109 * MINUTE)["active"] == 1
    assert _check(T0 + 110 * MINUTE)["warned"] == 1


def _reload_with_tenant(workload: Workload) -> Workload:
    return Workload.all_tenants.select_related("tenant").get(pk=workload.pk)


# --- extension --------------------------------------------------------------------------------


def test_extend_once_then_stop(world: World) -> None:
    # The extension is stamped with the real clock, so this notebook's clock is anchored to it.
    start = timezone.now() - 55 * MINUTE
    notebook = _notebook(world, started=start)
    client = client_for(world.member_a)
    _check(start + 50 * MINUTE)
    response = client.post(EXTEND.format(pk=notebook.pk))
    assert response.status_code == 200, response.content
    extended = _reload(notebook)
    assert extended.idle_extended_at is not None and extended.idle_warned_at is None
    assert _events(notebook, "workload.idle_extended") == [
        "Extended by member_a: it will be stopped after 60 minutes more without activity."
    ]
    assert _check(start + 60 * MINUTE)["active"] == 1, "the original deadline passed: extended"
    since = extended.idle_extended_at
    assert _check(since + 49 * MINUTE)["active"] == 1
    assert _check(since + 50 * MINUTE)["warned"] == 1
    assert _events(notebook, "workload.idle_warning")[-1].endswith(
        "unless you use it. Its files stay in your home; resume it any time from its page."
    )
    again = client.post(EXTEND.format(pk=notebook.pk))
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "already_extended"
    assert _check(since + 60 * MINUTE)["stopped"] == 1
    assert _reload(notebook).reason_code == ReasonCode.IDLE


def test_extending_needs_a_warning_and_a_running_notebook(world: World) -> None:
    notebook = _notebook(world)
    client = client_for(world.member_a)
    response = client.post(EXTEND.format(pk=notebook.pk))
    assert (response.status_code, response.json()["error"]["code"]) == (409, "not_idle_warned")
    Workload.all_tenants.filter(pk=notebook.pk).update(state=WorkloadState.CANCELLED, idle_warned_at=T0)
    response = client.post(EXTEND.format(pk=notebook.pk))
    assert (response.status_code, response.json()["error"]["code"]) == (409, "not_extendable")
    assert response.json()["error"]["details"]["current_state"] == "cancelled"


def test_who_may_extend(world: World) -> None:
    """The owner and tenant admins; another member is refused as for cancel (403); other tenants see nothing."""
    other = User.objects.create_user("member_2", password=PASSWORD)
    Membership.all_tenants.create(tenant=world.tenant_a, user=other, role="member")
    notebook = _notebook(world)
    Workload.all_tenants.filter(pk=notebook.pk).update(idle_warned_at=T0)
    url = EXTEND.format(pk=notebook.pk)
    refused = client_for(other).post(url)
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "permission_denied")
    assert client_for(world.viewer_a).post(url).status_code == 403
    assert client_for(world.admin_b).post(url).status_code == 404
    assert _reload(notebook).idle_extended_at is None
    assert client_for(world.admin_a).post(url).status_code == 200
    assert _reload(notebook).idle_extended_at is not None


# --- the real Jupyter client ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def jupyter_server(tmp_path: Path) -> Iterator[tuple[str, int, str]]:
    """A real Jupyter server serving /notebooks/7/ on a free port with a token; yields (endpoint, id, token).

    jupyter_server comes with the dev dependencies (jupyterlab), so this never skips.
    """
    port, token, workload_id = _free_port(), "t0ken-for-tests", 7
    env = {
        **os.environ,
        "JUPYTER_TOKEN": token,
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    }
    command = [
        sys.executable,
        "-m",
        "jupyter_server",
        f"--ServerApp.base_url=/notebooks/{workload_id}/",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={tmp_path}",
        "--ServerApp.open_browser=False",
        "--ServerApp.allow_root=True",  # CI containers run tests as root
    ]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                JupyterClient(timeout=1).activity(endpoint=endpoint, workload_id=workload_id, token=token)
                break
            except JupyterUnavailable:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.3)
        yield endpoint, workload_id, token
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_client_reads_a_real_jupyter_server(jupyter_server: tuple[str, int, str]) -> None:
    endpoint, workload_id, token = jupyter_server
    client = JupyterClient()
    first = client.activity(endpoint=endpoint, workload_id=workload_id, token=token)
    assert first.last_activity is not None and first.last_activity.tzinfo is not None
    assert (first.kernels, first.busy_kernels) == (0, 0)
    time.sleep(0.05)
    again = client.activity(endpoint=endpoint, workload_id=workload_id, token=token)
    assert again.last_activity == first.last_activity, "the idle check's own requests are not activity"
    # A user's request through the API is.
    started = urllib.request.Request(  # noqa: S310 -- a local test server
        f"{endpoint}/notebooks/{workload_id}/api/kernels",
        data=json.dumps({}).encode(),
        method="POST",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(started, timeout=30) as response:  # noqa: S310 -- a local test server
        assert response.status == 201
    after = client.activity(endpoint=endpoint, workload_id=workload_id, token=token)
    assert after.kernels == 1
    assert after.last_activity is not None and after.last_activity > first.last_activity
    with pytest.raises(JupyterUnavailable, match=r"40[13]"):
        client.activity(endpoint=endpoint, workload_id=workload_id, token="wrong")
    with pytest.raises(JupyterUnavailable):
        JupyterClient(timeout=0.5).activity(endpoint=f"http://127.0.0.1:{_free_port()}", workload_id=7, token=token)
