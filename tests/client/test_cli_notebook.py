"""Notebooks with `gpc`: `notebook open` waits for JupyterLab to answer and prints its URL; hibernate and resume."""

from __future__ import annotations

import json

import httpx
import pytest

from jobs.choices import WorkloadState
from jobs.models import Allocation
from tests.client.conftest import Platform, reached
from tests.frontend.live import session_headers
from tests.workers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

NOTEBOOK_IMAGE = "registry.example.com/jupyter/lab:4"


def _answers(platform: Platform, url: str) -> None:
    """Check that JupyterLab answers at `url` for its owner's browser session: the console hands the browser over
    to the notebook origin, which serves it through its proxy."""
    cookie = dict(session_headers(platform.world.member_a, origin=None))[b"cookie"].decode()
    page = httpx.get(url, headers={"Cookie": cookie}, follow_redirects=True, timeout=30)
    assert page.status_code == 200 and "JupyterLab" in page.text, (page.status_code, page.text[:300])
    assert page.url.host == "localhost", "JupyterLab is served on the notebook origin, never the console's"


def test_notebook_open_prints_the_url_once_jupyter_answers_and_hibernate_and_resume_round_trip(
    platform: Platform,
) -> None:
    gpc = platform.member
    done = gpc("-o", "json", "submit", "--kind", "notebook", "--image", NOTEBOOK_IMAGE, "--pool", "shared", "lab")
    assert done.returncode == 0, done.stderr
    notebook = json.loads(done.stdout)["id"]
    url = f"{platform.url}/notebooks/{notebook}/open"

    opened = gpc("notebook", "open", str(notebook), "--no-browser", timeout=120)
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.splitlines() == [url], "stdout holds the URL alone, for scripts"
    _answers(platform, url)
    steps = [line.split(None, 1) for line in opened.stderr.splitlines() if line.startswith("✓")]
    assert ["✓", "Placed on node cli-local"] in [[mark, rest.split("  ")[0]] for mark, rest in steps], opened.stderr
    assert reached(notebook, WorkloadState.RUNNING).attempt == 1

    hibernated = gpc("hibernate", str(notebook))
    assert hibernated.returncode == 0, hibernated.stderr
    assert f"hibernated {notebook} (lab)" in hibernated.stderr
    reached(notebook, WorkloadState.HIBERNATED)
    resting = gpc("notebook", "open", str(notebook), "--no-browser")
    assert resting.returncode == 6, resting.stderr
    assert f"gpc resume {notebook}" in resting.stderr and not resting.stdout

    # Its GPU is released once the node confirmed the stop; until then a resume is refused (409).
    assert wait_until(
        lambda: not Allocation.all_tenants.filter(workload_id=notebook, released_at__isnull=True).exists(), timeout=20
    )
    resumed = gpc("-o", "json", "resume", str(notebook))
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["state"] in {"pending", "scheduled", "starting", "running"}
    again = gpc("notebook", "open", str(notebook), "--no-browser", timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [url]
    _answers(platform, url)
    assert reached(notebook, WorkloadState.RUNNING).attempt == 2
    assert gpc("cancel", str(notebook)).returncode == 0
    reached(notebook, WorkloadState.CANCELLED)
