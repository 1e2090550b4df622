"""A notebook's files outlive its hibernation: a member's work in a real JupyterLab, reclaimed idle, resumed.

Everything is real but the clock of the idle check: the launch form, the
scheduling pass, the agent starting JupyterLab from this venv with the
process runtime (its home volume laid out under the data directory, its
working directory and HOME), the console's proxy (HTTP and the kernel's
WebSocket), `check_idle_notebooks` asking Jupyter for its activity and
hibernating it, the Resume button, and a second attempt in a new process.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from inventory.agent import executor as executor_module
from inventory.agent.config import AgentConfig, activate
from inventory.drivers.process._workdir import alive
from inventory.models import Gpu, agent_queue_for
from inventory.services.volume_access import host_path
from inventory.services.volumes import home_volume
from jobs.choices import ReasonCode, WorkloadState
from jobs.models import Allocation, Replica, Workload, WorkloadEvent
from jobs.services.idle import check_idle_notebooks
from tenants.context import Actor
from tests.browser.test_console import log_in
from tests.conftest import World
from tests.inventory.factories import make_node
from tests.jobs.factories import assign, give_quota
from tests.process_user import workload_python
from tests.workers import kill_process_sessions, running_worker, wait_until

pytestmark = pytest.mark.browser

NODE = "storage-local"
NOTEBOOK = "experiment.ipynb"
IDLE_TIMEOUT = 600
IDLE_WARNING = 60


@pytest.fixture
def agent(workload_tmp: Path, live_world: World, settings: Any) -> Iterator[Path]:
    """Node `storage-local` (process runtime, 1 GPU) with its agent and the controller's worker in this process.

    Yields the agent's work directory. Whatever Jupyter a failed test left
    running is killed at the end: a process-runtime workload is a session of its own.
    """
    settings.NOTEBOOK_COMMAND = [*workload_python(), "-m", "jupyterlab"]
    settings.NOTEBOOK_IDLE_TIMEOUT_SECONDS = IDLE_TIMEOUT
    settings.NOTEBOOK_IDLE_WARNING_SECONDS = IDLE_WARNING
    world = live_world
    give_quota(world)
    assign(world.member_a, world.project_a)
    node = make_node(
        Actor(user=world.operator), world.pool, name=NODE, runtime="process", cpu_cores=16, memory_mib=64_000
    )
    Gpu.objects.create(node=node, index=0, uuid=f"GPU-{NODE}-0", model="NVIDIA H100 80GB HBM3")
    work_dir = workload_tmp / "agent"
    config = AgentConfig(node=NODE, work_dir=work_dir, process_enabled=True, probe="simulated")
    activate(config)
    executor_module._executor = executor_module.Executor(config)
    try:
        with running_worker(["control", "ingest", agent_queue_for(NODE)], concurrency=4):
            yield work_dir
    finally:
        executor_module._executor = None
        kill_process_sessions(work_dir)


def _reached(workload_id: int, state: str, timeout: float = 45.0) -> Workload:
    def current() -> str:
        return Workload.all_tenants.get(pk=workload_id).state

    assert wait_until(lambda: current() == state, timeout=timeout, interval=0.1), (
        f"workload stayed {current()}; events: "
        + "; ".join(f"{e.to_state} {e.message}" for e in WorkloadEvent.all_tenants.filter(workload_id=workload_id))
    )
    return Workload.all_tenants.get(pk=workload_id)


def _jupyter_pid(work_dir: Path, workload: Workload) -> int:
    """Return the pid of the Jupyter server running the workload's current attempt."""
    replica = Replica.all_tenants.get(workload=workload, attempt=workload.attempt, index=0)
    state = json.loads((work_dir / replica.name / "state.json").read_text())
    assert alive(state["pid"], state.get("child_start")), "the replica's process is not running"
    return int(state["pid"])


def _launch_notebook(page: Any) -> int:
    """Log member_a in, launch a notebook from the form; return its id once its page shows."""
    log_in(page, "member_a")
    page.wait_for_url(lambda url: "/login/" not in url)
    page.goto("/t/tenant-a/launch/")
    form = page.locator("#launch form")
    form.locator("select[name=kind]").select_option("notebook")
    form.locator("input[name=name]").fill("scratch")
    form.locator("input[name=image]").fill("registry.example.com/jupyter/lab:4")
    form.locator("button[type=submit]").click()
    page.wait_for_url("**/t/tenant-a/workloads/*/")
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def _open_lab(page: Any) -> Any:
    """Click the workload page's Open notebook link and return JupyterLab's tab once its shell is up."""
    with page.context.expect_page() as opened:
        page.locator("#open-notebook").click()
    lab = opened.value
    lab.locator("#jp-main-dock-panel").wait_for(timeout=30_000)
    return lab


def _auto_opened_lab(page: Any, workload_id: int) -> Any:
    """Return the JupyterLab tab the workload page opened by itself once the notebook was ready."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        opened = [tab for tab in page.context.pages if f"/notebooks/{workload_id}/lab" in tab.url]
        if opened:
            opened[0].locator("#jp-main-dock-panel").wait_for(timeout=30_000)
            return opened[0]
        page.wait_for_timeout(100)
    raise AssertionError("the workload page did not open JupyterLab by itself")


def _kernel_idle(lab: Any) -> None:
    """Wait until the notebook's kernel is connected (through the proxy's WebSocket) and idle."""
    status = lab.locator('.jp-StatusBar-TextItem[title^="Change kernel"]', has_text="| Idle")
    status.wait_for(timeout=30_000)


def _run_cell(lab: Any, code: str) -> None:
    """Type `code` into the notebook's first cell and run it."""
    editor = lab.locator(".jp-NotebookPanel .jp-Cell").first.locator(".cm-content")
    editor.click()
    editor.fill(code)
    lab.keyboard.press("Shift+Enter")


def test_a_notebooks_files_survive_idle_hibernation_and_resume_where_its_owner_left_off(
    agent: Path, live_world: World, live_page: Any
) -> None:
    world = live_world
    content = f"kept across hibernation {uuid.uuid4().hex[:8]}"
    workload_id = _launch_notebook(live_page)
    workload = _reached(workload_id, WorkloadState.RUNNING)
    first_pid = _jupyter_pid(agent, workload)

    # In JupyterLab, through the console's proxy: a notebook whose cell writes a file, then saved.
    lab = _auto_opened_lab(live_page, workload_id)  # launched from this page: JupyterLab opens by itself
    assert lab.url.endswith(f"/notebooks/{workload_id}/lab"), lab.url
    lab.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
    _kernel_idle(lab)
    _run_cell(lab, f"with open('notes.txt', 'w') as out:\n    out.write({content!r})\nprint('written')")
    lab.locator(".jp-OutputArea-output", has_text="written").wait_for(timeout=20_000)
    lab.locator(".jp-Cell .jp-InputPrompt", has_text="[1]:").wait_for()  # the run is over: nothing changes after
    lab.keyboard.press("Control+s")
    rename = lab.locator(".jp-Dialog", has_text="Rename file")  # JupyterLab asks for a name on the first save
    rename.get_by_role("textbox", name="File name").fill(NOTEBOOK)
    rename.get_by_role("button", name="Rename and Save").click()
    lab.locator(f'.jp-DirListing-item[title^="Name: {NOTEBOOK}"]').wait_for()
    lab.locator(".jp-mod-dirty").wait_for(state="detached", timeout=10_000)
    lab.close()

    # Nobody uses it for longer than the idle timeout: the real check warns, then hibernates it.
    now = timezone.now() + timedelta(seconds=IDLE_TIMEOUT + 1)
    assert check_idle_notebooks(now=now).get("warned") == 1
    assert check_idle_notebooks(now=now + timedelta(seconds=IDLE_WARNING + 1)).get("stopped") == 1
    hibernated = _reached(workload_id, WorkloadState.HIBERNATED)
    assert hibernated.reason_code == ReasonCode.IDLE
    assert hibernated.lab_path == NOTEBOOK, "the check recorded the file its owner worked on"
    assert wait_until(
        lambda: not Allocation.all_tenants.filter(workload_id=workload_id, released_at__isnull=True).exists(),
        timeout=20,
    ), "its GPU is released once the node confirmed the stop"
    assert wait_until(lambda: not alive(first_pid, None), timeout=10), "its Jupyter process is gone"

    # Its files are in the owner's home volume, where the next attempt will find them.
    home = home_volume(tenant=world.tenant_a, user=world.member_a)
    home_dir = Path(host_path(home.backend, home, console=True))
    assert (home_dir / "notes.txt").read_text() == content
    assert (home_dir / NOTEBOOK).is_file()

    # The owner resumes it from its page: a new attempt in a new process, same home.
    live_page.reload()
    assert NOTEBOOK in live_page.locator("#hibernated-note").inner_text()
    live_page.locator("#action-resume button").click()
    live_page.wait_for_url(f"**/t/tenant-a/workloads/{workload_id}/")
    resumed = _reached(workload_id, WorkloadState.RUNNING)
    assert resumed.attempt == hibernated.attempt + 1
    assert _jupyter_pid(agent, resumed) != first_pid

    # Open lands on the notebook it was left at; the file the kernel wrote reads back in the editor.
    # The page shows the link live; only a first arrival from Launch opens JupyterLab by itself, and the
    # reload above (whose referrer is still the Launch page) re-armed nothing.
    live_page.locator("#open-notebook[href]").wait_for(timeout=30_000)
    href = live_page.locator("#open-notebook").get_attribute("href")
    assert href == f"/notebooks/{workload_id}/open?next=lab%2Ftree%2F{NOTEBOOK}", href
    live_page.wait_for_timeout(1_000)
    assert not [tab.url for tab in live_page.context.pages if "/lab" in tab.url]
    lab = _open_lab(live_page)
    assert lab.url.endswith(f"/notebooks/{workload_id}/lab/tree/{NOTEBOOK}"), lab.url
    lab.locator(f'.lm-TabBar-tab.jp-mod-current[title^="Name: {NOTEBOOK}"]').wait_for(timeout=20_000)
    lab.locator(".jp-NotebookPanel .jp-Cell .cm-content", has_text="notes.txt").wait_for(timeout=20_000)
    lab.locator(".jp-OutputArea-output", has_text="written").wait_for()
    lab.locator('.jp-DirListing-item[title^="Name: notes.txt"]').dblclick()
    lab.locator(".jp-FileEditor .cm-content", has_text=content).wait_for(timeout=10_000)
    lab.close()
