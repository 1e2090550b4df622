"""The faults the suite knows, and the settings a run of them takes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from _faults.services import SHARED_DATABASE, SHARED_REDIS
from _faults.truth import Design, designs

DOCKER_IMAGE = "gpucloud-test/busybox:latest"


@dataclass(frozen=True)
class Fault:
    """One fault: which console it hits, what breaks (`target`), and how (`action`)."""

    name: str
    mode: str  # embedded | distributed
    action: str  # kill | starve
    target: str = ""  # a component name, "agent" (the busiest), "redis", "postgres" or "docker"
    private: str = ""  # "redis", "postgres" or "docker": run that server privately, since the fault restarts it
    about: str = ""


FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        Fault("embedded-starve", "embedded", "starve", about="two busy processes beside `gpucloud up`"),
        Fault("embedded-kill", "embedded", "kill", "console", about="kill -9 `gpucloud up`, start it again"),
        Fault("web-kill", "distributed", "kill", "web", about="kill -9 `gpucloud serve`"),
        Fault("worker-kill", "distributed", "kill", "worker", about="kill -9 the controller's worker"),
        Fault("beat-kill", "distributed", "kill", "beat", about="kill -9 beat"),
        Fault("agent-kill", "distributed", "kill", "agent", about="kill -9 the agent running most replicas"),
        Fault("redis-restart", "distributed", "kill", "redis", "redis", about="kill -9 Redis (no persistence)"),
        Fault("postgres-restart", "distributed", "kill", "postgres", "postgres", about="Postgres immediate stop"),
        Fault("docker-restart", "distributed", "kill", "docker", "docker", about="kill -9 dockerd (live restore)"),
    )
}


@dataclass
class Settings:
    """How to run the faults; the defaults are the bench's (the tests pass smaller ones)."""

    code: Path
    work_root: Path = Path("/tmp/faults-runs")  # noqa: S108 -- scratch run directories, one per run
    starve_minutes: float = 15.0
    starve_jobs: int = 50
    starve_notebooks: int = 5
    jobs: int = 12
    notebooks: int = 2
    down: float = 5.0
    observe_min: float = 60.0
    observe_max: float = 300.0
    embedded_gpus: int = 8
    node_gpus: int = 4
    distributed_nodes: int = 2
    database_server: str = SHARED_DATABASE
    database_prefix: str = "gpucloud_faults_"
    redis_url: str = SHARED_REDIS
    worker_queues: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    keep: bool = False
    log: Callable[[str], None] = lambda message: print(message, file=sys.stderr, flush=True)


def plan_for(fault: Fault, settings: Settings) -> list[Design]:
    if fault.action == "starve":
        return designs(settings.starve_jobs, settings.starve_notebooks)
    if fault.private == "docker":
        return designs(settings.jobs, 0, cpu_only_every=1)  # no Jupyter image, no GPUs on that node
    return designs(settings.jobs, settings.notebooks)
