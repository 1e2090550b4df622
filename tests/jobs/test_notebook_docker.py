"""A notebook on the real Docker Engine keeps what its owner put in their home across hibernate and resume.

JupyterLab runs in the locally built notebook image (`.ci/build-notebook-image`: Debian's Python, the
console's JupyterLab and pip; nothing pulled) under the docker runtime, as the owner's mapped uid. The
test drives a kernel through the console's own proxy, as a browser does: it installs a package with
`pip install --user` and writes a file, hibernates the notebook, resumes it in a new container, and finds
both again. A second member of the tenant never reaches the notebook through the proxy.
"""

from __future__ import annotations

import subprocess
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from inventory.agent.config import AgentConfig
from inventory.services.volume_access import host_path
from inventory.services.volumes import home_volume
from jobs import services
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Allocation, AllowedImage, Replica, Workload
from tenants.context import Actor
from tests.conftest import ROOT, World
from tests.jobs.factories import run_pass_now
from tests.jobs.test_execution_docker import _reached, _world, docker_agent  # noqa: F401 -- the agent fixture
from tests.jobs.test_proxy import another_member, browser, console, execute, websocket  # noqa: F401 -- fixtures
from tests.workers import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]
NOTEBOOK_IMAGE = "gpucloud-test/jupyter:latest"
PACKAGE = "gpucloud_kept"


@pytest.fixture(scope="session")
def notebook_image() -> str:
    """Return the local notebook image, building it from this host (no pull) when missing or out of date."""
    subprocess.run([str(ROOT / ".ci" / "build-notebook-image"), NOTEBOOK_IMAGE], check=True, timeout=300)
    return NOTEBOOK_IMAGE


def _wheel(directory: Path) -> Path:
    """Write a one-module wheel (what `pip install --user` installs) and return its path."""
    wheel = directory / f"{PACKAGE}-1.0-py3-none-any.whl"
    info = f"{PACKAGE}-1.0.dist-info"
    files = {
        f"{PACKAGE}.py": "VALUE = 'installed before the hibernation'\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpucloud-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            archive.writestr(name, text)
    wheel.chmod(0o644)
    return wheel


@contextmanager
def _kernel(base_url: str, client: httpx.Client, workload_id: int) -> Iterator[Any]:
    """Start a kernel through the proxy once Jupyter answers; yield its channels, then shut it down."""
    base = f"/notebooks/{workload_id}"
    assert wait_until(lambda: client.get(f"{base}/api/status").status_code == 200, timeout=90), "Jupyter never answered"
    started = client.post(f"{base}/api/kernels", json={"name": "python3"})
    assert started.status_code == 201, started.text
    kernel = started.json()["id"]
    try:
        with websocket(base_url, client, f"{base}/api/kernels/{kernel}/channels") as channels:
            yield channels
    finally:
        client.delete(f"{base}/api/kernels/{kernel}")


def _container(workload: Workload) -> dict[str, Any]:
    """Return the driver's handle of the workload's current replica (the container it names)."""
    replica = Replica.all_tenants.filter(workload=workload, attempt=workload.attempt).first()
    assert replica is not None and replica.handle, "the agent reported its container"
    return dict(replica.handle)


def test_files_and_user_installed_packages_survive_hibernate_and_resume_in_a_new_container(
    world: World,
    docker_agent: AgentConfig,  # noqa: F811 -- the fixture imported above
    notebook_image: str,
    console: str,  # noqa: F811 -- the fixture imported above
    settings: Any,
) -> None:
    settings.NOTEBOOK_COMMAND = ["python3", "-m", "jupyterlab"]
    _world(world)
    AllowedImage.objects.create(pattern=notebook_image, notebook=True, description="the test's notebook image")
    owner = Actor(user=world.member_a)
    data = {"name": "lab", "kind": WorkloadKind.NOTEBOOK, "image": notebook_image, "pool": world.pool}
    notebook = services.submit_workload(actor=owner, project=world.project_a, data={**data, "gpus_per_replica": 0})
    run_pass_now()
    first = _reached(notebook, WorkloadState.RUNNING, timeout=90)
    home = home_volume(tenant=world.tenant_a, user=world.member_a)
    wheel = _wheel(Path(host_path(home.backend, home, console=True)))

    with browser(console, world.member_a, notebook.pk) as client, _kernel(console, client, notebook.pk) as channels:
        assert execute(channels, "import os; os.getuid() >= 100000, os.path.expanduser('~') == os.getcwd()") == (
            "(True, True)"
        ), "the kernel runs as the owner's mapped uid, in their home"
        install = (
            "import subprocess, sys; r = subprocess.run([sys.executable, '-m', 'pip', 'install', '--user',"
            f" '--no-index', '--no-deps', '--quiet', '{wheel.name}'], capture_output=True, text=True);"
            " (r.returncode, r.stderr[-400:])"
        )
        assert execute(channels, install) == "(0, '')"
        assert execute(channels, "open('notes.txt', 'w').write('kept across hibernation')") == "23"
        # A kernel started before ~/.local existed does not look there; the next one (after the resume) does.
        user_site = f"import site; os.path.isfile(os.path.join(site.getusersitepackages(), '{PACKAGE}.py'))"
        assert execute(channels, user_site) == "True", "pip --user installed it into the home volume"
    first_container = _container(first)

    services.hibernate_notebook(actor=owner, workload=first)
    _reached(notebook, WorkloadState.HIBERNATED, timeout=60)
    assert wait_until(
        lambda: not Allocation.all_tenants.filter(workload=notebook, released_at__isnull=True).exists(), timeout=30
    )
    services.resume_notebook(actor=owner, workload=Workload.all_tenants.get(pk=notebook.pk))
    run_pass_now()
    resumed = _reached(notebook, WorkloadState.RUNNING, timeout=90)
    assert resumed.attempt == first.attempt + 1
    assert _container(resumed) != first_container, "a new container: nothing of the old one's layer is left"

    with browser(console, world.member_a, notebook.pk) as client, _kernel(console, client, notebook.pk) as channels:
        assert execute(channels, "open('notes.txt').read()") == "'kept across hibernation'"
        assert execute(channels, f"import {PACKAGE}; {PACKAGE}.VALUE") == "'installed before the hibernation'"
    with browser(console, another_member(world)) as stranger:
        assert stranger.get(f"/notebooks/{notebook.pk}/api/status").status_code == 404
    services.cancel_workload(actor=owner, workload=Workload.all_tenants.get(pk=notebook.pk))
    _reached(notebook, WorkloadState.CANCELLED, timeout=60)
