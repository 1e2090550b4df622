"""The data scientist's journey: launch a notebook, watch it come up, work in JupyterLab, hibernate, resume.

From an empty database. What other personas do first goes through their
services — the first operator (as `gpucloud up` creates it), a tenant, a
pool, a node that really runs notebooks (the process runtime starting
JupyterLab from this venv, its agent and the controller's worker in this
process), the tenant's quota, a project with its quota of one GPU, the data
scientist invited onto it. Everything the data scientist does goes through
the browser: logging in, Launch, the workload page following the launch
steps live (no reload), JupyterLab opening by itself, a file written from
a notebook cell, a second workload waiting for the quota with its reason in
words on the queue page, Hibernate, Resume, and the file still there.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from inventory.agent import executor as executor_module
from inventory.agent.config import AgentConfig, activate
from inventory.models import Gpu, agent_queue_for
from inventory.services.pools import create_node_pool
from jobs.choices import WorkloadState
from jobs.models import Allocation, Workload
from tenants import services as tenant_services
from tenants.context import Actor
from tenants.scoping import tenant_scope
from tenants.services.quotas import QuotaValues
from tests.browser.journey import Journey
from tests.conftest import PASSWORD
from tests.inventory.factories import make_node
from tests.jobs.factories import assign
from tests.process_user import workload_python
from tests.workers import kill_process_sessions, running_worker, wait_until

pytestmark = pytest.mark.browser

NODE = "gpu-01"
SCIENTIST = "dana"
STEP_TIMEOUT_MS = 60_000


@dataclass(frozen=True)
class Platform:
    """What exists before the data scientist's first visit: their tenant and project, and the agent's directory."""

    tenant_slug: str
    project_slug: str
    work_dir: Path


@pytest.fixture
def platform(workload_tmp: Path, browser: Any, transactional_db: None, settings: Any) -> Iterator[Platform]:
    """An empty database set up by the other personas, and a notebook node with its agent running in this process."""
    settings.NOTEBOOK_COMMAND = [*workload_python(), "-m", "jupyterlab"]
    operator = User.objects.create_user("root", "root@example.com", PASSWORD, is_staff=True, is_superuser=True)
    as_operator = Actor(user=operator)
    tenant = tenant_services.create_tenant(actor=as_operator, slug="vision", name="Vision Lab")
    pool = create_node_pool(actor=as_operator, name="gpu")
    node = make_node(as_operator, pool, name=NODE, runtime="process", cpu_cores=16, memory_mib=64_000)
    Gpu.objects.create(node=node, index=0, uuid=f"GPU-{NODE}-0", model="NVIDIA H100 80GB HBM3")
    tenant_services.create_tenant_quota(actor=as_operator, tenant=tenant, pool=pool, values=QuotaValues(limit=4))
    project = tenant_services.create_project(actor=as_operator, tenant=tenant, slug="detection", name="Detection")
    tenant_services.create_project_quota(actor=as_operator, project=project, pool=pool, values=QuotaValues(limit=1))
    with tenant_scope(tenant):  # as the tenant's pages run it
        issued = tenant_services.invite_member(actor=as_operator, tenant=tenant, username=SCIENTIST)
    secret = issued.link_path.rstrip("/").rsplit("/", 1)[-1]
    scientist = tenant_services.create_invited_account(secret=secret, password=PASSWORD)
    assign(scientist, project)

    work_dir = workload_tmp / "agent"
    config = AgentConfig(node=NODE, work_dir=work_dir, process_enabled=True, probe="simulated")
    activate(config)
    executor_module._executor = executor_module.Executor(config)
    try:
        with running_worker(["control", "ingest", agent_queue_for(NODE)], concurrency=4):
            yield Platform(tenant.slug, project.slug, work_dir)
    finally:
        executor_module._executor = None
        kill_process_sessions(work_dir)


def _step(page: Any, key: str, status: str) -> Any:
    """Wait until the launch step `key` shows `status` (done, current) on the workload page; return it."""
    step = page.locator(f'#launch-steps li[data-step="{key}"][data-status="{status}"]')
    step.wait_for(timeout=STEP_TIMEOUT_MS)
    return step


def _not_reloaded(page: Any) -> bool:
    return bool(page.evaluate("window.journeyMark === true"))


def _launch(page: Any, tenant: str, *, kind: str, name: str, command: str = "") -> None:
    page.goto(f"/t/{tenant}/launch/")
    form = page.locator("#launch form")
    form.locator("select[name=kind]").select_option(kind)
    form.locator("input[name=name]").fill(name)
    form.locator("input[name=image]").fill("registry.example.com/jupyter/lab:4")
    if command:
        form.locator("input[name=command]").fill(command)
    form.locator("button[type=submit]").click()
    page.wait_for_url(f"**/t/{tenant}/workloads/*/")


def _kernel_ready_and_write(lab: Any, text: str) -> None:
    """In JupyterLab: a new notebook whose first cell writes `text` to notes.txt in the home directory."""
    lab.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
    lab.locator('.jp-StatusBar-TextItem[title^="Change kernel"]', has_text="| Idle").wait_for(timeout=30_000)
    editor = lab.locator(".jp-NotebookPanel .jp-Cell").first.locator(".cm-content")
    editor.click()
    editor.fill(f"with open('notes.txt', 'w') as out:\n    out.write({text!r})\nprint('written')")
    lab.keyboard.press("Shift+Enter")
    lab.locator(".jp-OutputArea-output", has_text="written").wait_for(timeout=20_000)
    lab.locator('.jp-DirListing-item[title^="Name: notes.txt"]').wait_for(timeout=10_000)


def _accept_restored_notebook_dialog(lab: Any) -> None:
    """JupyterLab reopens the notebook left open before and asks for its kernel: take the one it offers."""
    dialog = lab.locator(".jp-Dialog")
    with contextlib.suppress(PlaywrightTimeout):
        dialog.wait_for(timeout=5_000)
        dialog.locator(".jp-mod-accept").click()
        dialog.wait_for(state="detached", timeout=10_000)


def test_a_data_scientist_launches_a_notebook_works_in_it_hibernates_and_resumes_it(
    platform: Platform, live_page: Any
) -> None:
    journey = Journey("data-scientist", "A data scientist launches a notebook")
    page, tenant = live_page, platform.tenant_slug
    page.on("dialog", lambda dialog: dialog.accept())  # "Cancel train?" and the like: yes
    content = f"results of run {uuid.uuid4().hex[:8]}"

    # Log in: the console opens on the tenant.
    page.goto("/login/")
    page.fill("input[name=username]", SCIENTIST)
    page.fill("input[name=password]", PASSWORD)
    journey.step(page, "The data scientist signs in")
    page.click("#login-form button[type=submit]")
    page.wait_for_url(f"**/t/{tenant}/")

    # Launch a notebook from the Launch page: its page shows where the launch stands, live.
    page.goto(f"/t/{tenant}/launch/")
    page.locator("#launch form select[name=kind]").select_option("notebook")
    page.locator("#launch form input[name=name]").fill("explore")
    page.locator("#launch form input[name=image]").fill("registry.example.com/jupyter/lab:4")
    journey.step(page, "Launch: a notebook named explore")
    with page.context.expect_page(timeout=90_000) as lab_opened:
        page.locator("#launch form button[type=submit]").click()
        page.wait_for_url(f"**/t/{tenant}/workloads/*/")
        notebook_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        page.evaluate("window.journeyMark = true")
        page.locator("#messages").get_by_text("Workload explore submitted.").wait_for()
        page.locator('#launch-steps li[data-step="queued"]').wait_for()
        # JupyterLab takes a few seconds to answer: the page marks that step, with the node it was placed on.
        waiting = _step(page, "jupyter", "current")
        assert "Waiting for Jupyter" in waiting.inner_text()
        assert f"Placed on node {NODE}" in _step(page, "placed", "done").inner_text()
        assert page.locator("#open-notebook").is_disabled(), "Open JupyterLab waits for Jupyter"
        journey.step(page, "The launch steps, live: placed on the node, waiting for Jupyter")
        ready = _step(page, "ready", "current")
        assert "Ready" in ready.inner_text()
    assert _not_reloaded(page), "the steps moved without a reload"
    assert page.locator("#workload-state .state").inner_text() == "Running"
    assert page.locator("#open-notebook").get_attribute("href") == f"/notebooks/{notebook_id}/open"

    # JupyterLab opened by itself, since the notebook was launched from here: work in it.
    lab = lab_opened.value
    lab.locator("#jp-main-dock-panel").wait_for(timeout=30_000)
    assert f"/notebooks/{notebook_id}/lab" in lab.url, lab.url
    assert not lab.url.startswith(page.url.split("/t/")[0]), "JupyterLab is on the notebook origin, not the console's"
    _kernel_ready_and_write(lab, content)
    journey.step(lab, "JupyterLab opened by itself: a cell writes notes.txt")
    lab.close()
    journey.step(page, "The notebook's page once it runs: every step done, Open JupyterLab active")

    # A second workload does not fit the project's one-GPU quota: the queue says why, in words.
    _launch(page, tenant, kind="job", name="train", command="python train.py")
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    page.locator("#why-pending", has_text="Quota limit reached").wait_for(timeout=STEP_TIMEOUT_MS)
    page.goto(f"/t/{tenant}/queue/")
    row = page.locator(f'#waiting tr[data-workload="{job_id}"]')
    row.get_by_text("Quota limit reached").wait_for()
    assert row.locator(".reason-code").get_attribute("title") == "QUOTA_LIMIT"
    journey.step(page, "The queue says why train waits: the project's quota limit")
    page.goto(f"/t/{tenant}/workloads/{job_id}/")
    page.locator("#action-cancel button").click()
    page.locator("#workload-state .state", has_text="Cancelled").wait_for()

    # Hibernate the notebook from its page: its GPU is freed, its files stay.
    page.goto(f"/t/{tenant}/workloads/{notebook_id}/")
    page.locator("#action-hibernate button").click()
    page.locator("#hibernated-note").wait_for(timeout=STEP_TIMEOUT_MS)
    assert page.locator("#workload-state .state").inner_text() == "Hibernated"
    journey.step(page, "Hibernated: no GPU held, files kept")
    assert wait_until(
        lambda: not Allocation.all_tenants.filter(workload_id=notebook_id, released_at__isnull=True).exists(),
        timeout=30,
    ), "its GPU is released once the node stopped it"

    # Resume: the steps start over, live, and Open JupyterLab becomes active again.
    page.locator("#action-resume button").click()
    page.wait_for_url(f"**/t/{tenant}/workloads/{notebook_id}/")
    page.evaluate("window.journeyMark = true")
    _step(page, "ready", "current")
    assert _not_reloaded(page)
    assert Workload.all_tenants.get(pk=notebook_id).state == WorkloadState.RUNNING
    assert "attempt 2" in page.locator("#workload-state").inner_text()
    journey.step(page, "Resumed as attempt 2: ready again")

    # The file written before hibernating is still there.
    with page.context.expect_page() as reopened:
        page.locator("#open-notebook").click()
    lab = reopened.value
    lab.locator("#jp-main-dock-panel").wait_for(timeout=30_000)
    _accept_restored_notebook_dialog(lab)
    lab.locator('.jp-DirListing-item[title^="Name: notes.txt"]').dblclick(timeout=30_000)
    lab.locator(".jp-FileEditor .cm-content", has_text=content).wait_for(timeout=20_000)
    journey.step(lab, "After resuming, notes.txt is still there")
    lab.close()
