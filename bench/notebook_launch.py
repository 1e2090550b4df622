"""Click on Launch to a usable JupyterLab in the browser, as a data scientist sees it.

    .venv/bin/python bench/notebook_launch.py [--runs 10] [--runtime process|docker]

The setup of bench/notebook_start.py (embedded mode in a scratch directory:
the controller's worker and the node's agent in this process, the console's
ASGI application under uvicorn), driven by Debian's Chromium through
Playwright. Each run opens the launch page, fills in a notebook as a person
would, and measures from the click on Launch until JupyterLab's own
interface has rendered in the browser through the console's proxy (its
main dock panel is visible): the launch steps on the workload page, the
scheduling pass, the runtime's start, Jupyter's readiness and the proxy are
all inside. Where the workload page does not open JupyterLab by itself, the
bench clicks its "Open JupyterLab" button as soon as it is enabled, as a
person would. Prints JSON with the median and worst.

`--runtime docker` runs the image built by .ci/build-notebook-image (no
pull) on the local engine without a GPU; `--runtime process` runs
JupyterLab from this venv.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from execution_start import _setup_django
from notebook_resume import DOCKER_IMAGE, PROCESS_IMAGE, _released, _use_docker
from notebook_start import _session, _start, _world

LIMIT_S = 120.0
LAB_READY = "#jp-main-dock-panel"


def _launch(tab: Any, name: str, image: str, gpus: int) -> float:
    """Fill in the launch form for notebook `name` and click Launch; return when the click happened."""
    tab.goto("/t/bench/launch/")
    tab.select_option("select[name=kind]", "notebook")
    tab.fill("input[name=name]", name)
    tab.fill("input[name=image]", image)
    tab.fill("input[name=gpus_per_replica]", str(gpus))
    started = time.perf_counter()
    tab.click("#launch-submit")
    return started


def _lab_open(context: Any) -> bool:
    """Whether any tab of `context` shows JupyterLab's rendered interface."""
    for tab in context.pages:
        if "/notebooks/" in tab.url and tab.locator(LAB_READY).count():
            return tab.locator(LAB_READY).first.is_visible()
    return False


def _until_lab(context: Any, tab: Any, started: float) -> float:
    """Wait until JupyterLab has rendered; click "Open JupyterLab" if the page offers it and has not opened it."""
    while time.perf_counter() - started < LIMIT_S:
        if _lab_open(context):
            return time.perf_counter() - started
        button = tab.locator("a#open-notebook")
        if "/notebooks/" not in tab.url and button.count() and button.first.is_visible():
            button.first.click()
        tab.wait_for_timeout(20)
    raise RuntimeError(f"JupyterLab was not usable within {LIMIT_S:g} s of the click")


def _stop(actor: Any, name: str) -> None:
    from jobs import services
    from jobs.models import Workload

    workload = Workload.all_tenants.get(name=name)
    services.cancel_workload(actor=actor, workload=workload)
    deadline = time.monotonic() + LIMIT_S
    while not _released(workload.pk):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} still held its GPUs {LIMIT_S:g} s after it was cancelled")
        time.sleep(0.05)
    time.sleep(0.6)  # past the pass trigger's debounce window


def _leave(tab: Any) -> None:
    """Navigate `tab` to about:blank; JupyterLab may redirect it meanwhile (its workspace reset): try again."""
    from playwright.sync_api import Error as PlaywrightError

    for _ in range(5):
        try:
            tab.goto("about:blank")
            return
        except PlaywrightError:
            time.sleep(0.3)
    tab.goto("about:blank")


def _runs(console: str, cookie: str, actor: Any, count: int, image: str, gpus: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    executable = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium")
    name, value = cookie.split("=", 1)
    seconds: list[float] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-background-networking"]
        )
        for run in range(count):
            context = browser.new_context(base_url=console)
            context.add_cookies([{"name": name, "value": value, "url": console}])
            tab = context.new_page()
            started = _launch(tab, f"nb-{run}", image, gpus)
            seconds.append(_until_lab(context, tab, started))
            print(f"run {run}: {seconds[-1]:.2f} s", file=sys.stderr, flush=True)
            # Leave JupyterLab (goto, which has a timeout): closing a context with a live lab tab can wait forever.
            for opened in context.pages:
                _leave(opened)
            _stop(actor, f"nb-{run}")
    return seconds  # the browser goes with this process (os._exit in main)


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` shows where a stuck run waits
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--runtime", choices=["process", "docker"], default="process")
    parser.add_argument("--image", default=DOCKER_IMAGE, help="the notebook image of --runtime docker")
    args = parser.parse_args()
    docker = args.runtime == "docker"
    command = "python3,-m,jupyterlab" if docker else f"{sys.executable},-m,jupyterlab"
    os.environ.setdefault("NOTEBOOK_COMMAND", command)
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's loop runs on the ORM's thread
    with tempfile.TemporaryDirectory(prefix="gpucloud-bench-") as scratch:
        _setup_django(Path(scratch))
        user, _project, _pool = _world()
        from tenants.context import Actor

        if docker:
            _use_docker(args.image)
        console = _start(Path(scratch) / "agent", pages=True)
        seconds = _runs(
            console,
            _session(user),
            Actor(user=user),  # type: ignore[arg-type]
            args.runs,
            args.image if docker else PROCESS_IMAGE,
            0 if docker else 1,
        )
    figures = {"median": round(statistics.median(seconds), 2), "max": round(max(seconds), 2)}
    print(json.dumps({"runs": args.runs, "runtime": args.runtime, "click_to_usable_lab_s": figures}, indent=2))
    os._exit(0)  # the embedded worker and uvicorn threads do not need an orderly stop


if __name__ == "__main__":
    main()
