"""A newcomer's first `gpucloud up` / `make run`: the closing banner, the port, this machine as node `local`,
and the demo fleet, with a real process on a real port."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucloud.banner import SignIn, console_url, render
from tests.gpucloud.test_up import ROOT, _get, console
from tests.process_user import _passable


def _rows(data_dir: Path, query: str) -> list[tuple[object, ...]]:
    """Read the console's own SQLite database, as another process may while it runs."""
    with sqlite3.connect(data_dir / "gpucloud.sqlite3", timeout=10) as database:
        return database.execute(query).fetchall()


def _banner(output: str) -> list[str]:
    """Return the lines printed between the last start message and the server's own log."""
    before_server = output.split("INFO:     Started server process")[0]
    lines = [line for line in before_server.splitlines() if line.strip()]
    return lines[max(i for i, line in enumerate(lines) if "gpucloud console on" in line) - 1 :]


def test_the_banner_is_the_last_thing_before_the_servers_log_with_the_url_and_the_credentials(tmp_path: Path) -> None:
    with console(tmp_path) as run:
        # Notebooks have their own origin, the next port, served by the same process: no console page there.
        port = int(run.base.rsplit(":", 1)[1])
        notebooks = f"http://127.0.0.1:{port + 1}"
        assert _get(f"{notebooks}/login/") == (404, b"Not found.")
        assert _get(f"{run.base}/login/")[0] == 200
    banner = "\n".join(_banner(run.output))
    assert f"gpucloud console on {run.base}" in banner
    assert f"Notebooks:    {notebooks} (their own origin" in banner
    user = re.search(r"User name: +(\S+)", banner)
    password = re.search(r"Password: +(\S+)", banner)
    assert user and password, run.output
    assert user.group(1) == "admin" and len(password.group(1)) >= 16
    assert "shown only this once" in banner
    assert "Stop with Ctrl+C" in banner
    # The install and migration progress came before it, never after.
    assert run.output.index("Preparing the database") < run.output.index("gpucloud console on")


def test_the_first_start_makes_this_machine_a_process_node_labelled_unisolated(tmp_path: Path) -> None:
    with console(tmp_path) as run:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = _rows(tmp_path, "SELECT name, runtime, state FROM inventory_node")
            if rows == [("local", "process", "ready")]:
                break
            time.sleep(0.3)
    assert rows == [("local", "process", "ready")], (rows, run.output)
    assert "This machine: node local in pool local, process runtime: NOT isolated, for development only" in run.output
    if os.geteuid() == 0:  # workloads run as unprivileged users: the banner says whether they can run Jupyter
        reachable = _passable(Path(sys.executable).parent) and _passable(Path(sys.executable).resolve().parent)
        expected = "workloads run as unprivileged users" if reachable else "notebooks will not start"
        assert expected in run.output, run.output

    with console(tmp_path) as again:
        pass
    assert _rows(tmp_path, "SELECT count(*) FROM inventory_node") == [(1,)], "a second start registers nothing"
    assert "This machine: node local (Local process (not isolated), Ready)" in again.output


@pytest.mark.docker
def test_with_a_docker_engine_this_machine_is_a_docker_node_with_a_notebook_image_built_here(tmp_path: Path) -> None:
    """Nothing is pulled: the image comes from this host's files, and the health check runs it instead of busybox."""
    with console(tmp_path, GPUCLOUD_LOCAL_NODE="docker") as run:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = _rows(tmp_path, "SELECT name, runtime, state, state_reason FROM inventory_node")
            if rows and rows[0][2] in ("ready", "failed"):
                break
            time.sleep(0.3)
    assert rows == [("local", "docker", "ready", "")], (rows, run.output)
    assert "notebook image gpucloud/jupyter:local" in run.output
    docker = shutil.which("docker") or "docker"
    inspected = subprocess.run([docker, "image", "inspect", "gpucloud/jupyter:local"], capture_output=True, check=False)
    assert inspected.returncode == 0


def test_the_local_node_is_opt_out_and_the_port_is_chosen(tmp_path: Path) -> None:
    with console(tmp_path, GPUCLOUD_LOCAL_NODE="off") as run:
        assert _get(f"{run.base}/healthz")[0] == 200
    assert _rows(tmp_path, "SELECT count(*) FROM inventory_node") == [(0,)]
    assert "This machine: GPUCLOUD_LOCAL_NODE=off" in run.output


def test_up_demo_adds_the_simulated_fleet_and_the_scheduler_places_it(tmp_path: Path) -> None:
    with console(tmp_path, GPUCLOUD_LOCAL_NODE="off", extra_args=["--demo"]) as run:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = _rows(tmp_path, "SELECT state, count(*) FROM jobs_workload GROUP BY state")
            states = {str(state): int(str(count)) for state, count in rows}
            if states.get("running"):
                break
            time.sleep(0.3)
    assert states.get("running") and states.get("pending"), states
    assert "Demo fleet:   Simulated demo fleet added: 4 nodes of 8 GPUs in pool sim-demo" in run.output


def test_make_run_passes_the_port_the_address_and_the_demo_to_gpucloud_up() -> None:
    make = shutil.which("make") or "make"
    dry_run = subprocess.run(
        [make, "-n", "run", "PORT=8123", "HOST=0.0.0.0", "DEMO=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "gpucloud up --port 8123 --host 0.0.0.0 --demo" in dry_run
    plain = subprocess.run([make, "-n", "run"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert re.search(r"gpucloud up\s*$", plain, re.M), "without PORT the console takes GPUCLOUD_PORT or 8000"


@pytest.mark.parametrize(
    ("host", "url"),
    [("127.0.0.1", "http://127.0.0.1:8080"), ("0.0.0.0", "http://127.0.0.1:8080"), ("::1", "http://[::1]:8080")],  # noqa: S104
)
def test_the_url_is_one_a_browser_on_this_machine_opens(host: str, url: str) -> None:
    assert console_url(host, 8080) == url


def test_a_later_start_says_where_the_password_came_from() -> None:
    text = render(url="http://127.0.0.1:8000", sign_in=SignIn("ops"), this_machine="", demo="")
    assert "User name:    ops" in text and "printed at the first start" in text
