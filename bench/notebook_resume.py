"""Notebook resume from hibernation to a usable JupyterLab through the console's proxy.

    .venv/bin/python bench/notebook_resume.py [--runs 10] [--runtime process|docker]

The setup of bench/notebook_start.py (embedded mode in a scratch
directory: the controller's worker and the node's agent in this process,
the console's ASGI application under uvicorn), one notebook submitted and
used once. Each run then hibernates it as its owner would
(`hibernate_notebook`; not timed past its GPU's release) and measures
from `resume_notebook` until (a) the ledger says `running` again, a new
attempt (Jupyter answered the agent's readiness check) and (b) the
owner's browser session gets 200 for the JupyterLab page and the
server's status through `/notebooks/<id>/`. Prints JSON with the median
and worst of both, and of hibernate to GPU released.

`--runtime process` (default) runs JupyterLab from this venv. `--runtime
docker` runs the image `--image` (default gpucloud-test/jupyter:latest,
built without any pull by .ci/build-notebook-image) on the local engine,
as `python3 -m jupyterlab`, holding no GPU unless `--gpus` says (a GPU
needs the NVIDIA container runtime).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from execution_start import _setup_django
from notebook_start import NODE, _session, _start, _world, hand_off

DOCKER_IMAGE = "gpucloud-test/jupyter:latest"
PROCESS_IMAGE = "registry.local/jupyter:lab"
LIMIT_S = 90.0


def _released(workload_id: int) -> bool:
    from jobs.models import Allocation

    return not Allocation.all_tenants.filter(workload_id=workload_id, released_at__isnull=True).exists()


def _until_usable(console: str, cookie: str, workload_id: int, attempt: int, started: float) -> tuple[float, float]:
    """Poll until the attempt runs and its JupyterLab answers through the proxy; return (running, usable) seconds."""
    import httpx

    from jobs.models import Workload

    running = 0.0
    entered = None
    with httpx.Client(timeout=10) as browser:
        while True:
            if time.perf_counter() - started > LIMIT_S:
                raise RuntimeError(f"notebook {workload_id} was not usable within {LIMIT_S:g} s")
            if not running and Workload.all_tenants.filter(pk=workload_id, state="running", attempt=attempt).exists():
                running = time.perf_counter() - started
            if running and entered is None:
                # The console hands a browser over to the notebook's own origin once the notebook runs.
                entered = hand_off(console, cookie, workload_id)
                if entered is not None:
                    browser.base_url, browser.headers["Cookie"] = httpx.URL(entered[0]), entered[1]
            if entered is not None:
                lab = browser.get(f"/notebooks/{workload_id}/lab")
                status = browser.get(f"/notebooks/{workload_id}/api/status")
                if lab.status_code == 200 and status.status_code == 200:
                    return running, time.perf_counter() - started
            time.sleep(0.01)


def _submit(actor: Any, project: Any, pool: Any, image: str, gpus: int) -> int:
    from jobs import services

    data = {"name": "nb", "kind": "notebook", "image": image, "pool": pool, "gpus_per_replica": gpus}
    return services.submit_workload(actor=actor, project=project, data=data).pk


def _hibernate(actor: Any, workload_id: int) -> float:
    """Hibernate the notebook as its owner; return the seconds until its GPU is released."""
    from jobs import services
    from jobs.models import Workload

    started = time.perf_counter()
    services.hibernate_notebook(actor=actor, workload=Workload.all_tenants.get(pk=workload_id))
    while not _released(workload_id):
        if time.perf_counter() - started > LIMIT_S:
            raise RuntimeError(f"notebook {workload_id} still held its GPU {LIMIT_S:g} s after hibernating")
        time.sleep(0.01)
    return time.perf_counter() - started


def _resume(console: str, cookie: str, actor: Any, workload_id: int) -> tuple[float, float]:
    from jobs import services
    from jobs.models import Workload

    started = time.perf_counter()
    resumed = services.resume_notebook(actor=actor, workload=Workload.all_tenants.get(pk=workload_id))
    return _until_usable(console, cookie, workload_id, resumed.attempt, started)


def _figures(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "max": round(max(values), 2)}


def _use_docker(image: str) -> None:
    """Make the bench node a Docker node and allow `image` as a notebook image (the allow-list on)."""
    from inventory.models import Node
    from jobs.models import AllowedImage

    if subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False).returncode != 0:
        sys.exit(f"no local image {image}: build it with .ci/build-notebook-image (nothing is pulled)")
    Node.objects.filter(name=NODE).update(runtime="docker")
    AllowedImage.objects.create(pattern=image, notebook=True, description="bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--runtime", choices=["process", "docker"], default="process")
    parser.add_argument("--image", default=DOCKER_IMAGE, help="the notebook image of --runtime docker")
    parser.add_argument("--gpus", type=int, help="GPUs the notebook holds (default: 1; 0 with docker)")
    args = parser.parse_args()
    docker = args.runtime == "docker"
    gpus = args.gpus if args.gpus is not None else 0 if docker else 1
    command = "python3,-m,jupyterlab" if docker else f"{sys.executable},-m,jupyterlab"
    os.environ.setdefault("NOTEBOOK_COMMAND", command)
    with tempfile.TemporaryDirectory(prefix="gpucloud-bench-") as scratch:
        _setup_django(Path(scratch))
        user, project, pool = _world()
        from tenants.context import Actor

        if docker:
            _use_docker(args.image)
        console = _start(Path(scratch) / "agent")
        cookie = _session(user)
        actor = Actor(user=user)  # type: ignore[arg-type]
        workload_id = _submit(actor, project, pool, args.image if docker else PROCESS_IMAGE, gpus)
        first = _until_usable(console, cookie, workload_id, 1, time.perf_counter())
        hibernated, runs = [], []
        for _ in range(args.runs):
            hibernated.append(_hibernate(actor, workload_id))
            time.sleep(0.6)  # past the pass trigger's debounce window
            runs.append(_resume(console, cookie, actor, workload_id))
        _hibernate(actor, workload_id)
    result = {
        "runtime": args.runtime,
        "runs": args.runs,
        "gpus": gpus,
        "first_start_to_usable_s": round(first[1], 2),
        "hibernate_to_gpu_released_s": _figures(hibernated),
        "resume_to_running_s": _figures([running for running, _ in runs]),
        "resume_to_usable_through_proxy_s": _figures([usable for _, usable in runs]),
    }
    print(json.dumps(result, indent=2))
    os._exit(0)  # the embedded worker and uvicorn threads do not need an orderly stop


if __name__ == "__main__":
    main()
