"""The console as deployed, from one code tree: embedded (`gpucloud up`) or distributed (web, worker, beat, agents).

Every component is the real command (`gpucloud up|serve|worker|agent`)
started through `launch.py` with PYTHONPATH at the measured tree, so the
same harness runs the code of any commit. Embedded: one process, SQLite in
the run's data directory, node `local` with simulated GPUs. Distributed:
Postgres and Redis from the caller, one web process, one controller worker
(the CLI's default queues), beat on its own (`gpucloud beat` where the CLI
has it; else a worker on an otherwise unused queue with `--beat`), and one
agent per node (`--probe simulated --simulated-gpus N --allow-process-runtime`).
"""

from __future__ import annotations

import importlib.util
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from _faults.ledger import Ledger
from _faults.procs import PYTHON, Proc, free_port, wait_until

LAUNCH = Path(__file__).resolve().parent / "launch.py"
_OWN_VARIABLES = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "DJANGO_SETTINGS_MODULE", "PYTHONPATH")


@dataclass
class Topology:
    """What one run starts: its components by name, where the console answers, and how to read its ledger."""

    code: Path
    run_dir: Path
    mode: str  # "embedded" or "distributed"
    nodes: list[tuple[str, int]]  # (node name, GPUs)
    env: dict[str, str]
    port: int
    runtime: str = "process"  # of every node: process, or docker (the docker fault's private engine)
    components: dict[str, Proc] = field(default_factory=dict)
    database_url: str | None = None
    redis_url: str | None = None

    @property
    def console(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.run_dir / "data"

    @property
    def queue_samples(self) -> Path:
        return self.run_dir / "queues.jsonl"

    @property
    def gpus(self) -> int:
        return sum(count for _, count in self.nodes)

    def ledger(self) -> Ledger:
        if self.database_url is not None:
            return Ledger(database_url=self.database_url)
        return Ledger(sqlite_path=self.data_dir / "gpucloud.sqlite3")

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.console}/healthz", timeout=3).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, names: list[str] | None = None, *, timeout: float = 180) -> None:
        """Start the named components (all by default); wait for the console to answer when it is among them."""
        for name in names or list(self.components):
            self.components[name].start()
        if names is None or self.web in names:
            web = self.components[self.web]
            if not wait_until(lambda: self.healthy() or not web.alive, timeout, interval=0.3) or not web.alive:
                raise RuntimeError(f"{web.name} did not answer /healthz within {timeout:g} s:\n{web.tail()}")

    @property
    def web(self) -> str:
        return "console" if self.mode == "embedded" else "web"

    def stop(self) -> None:
        for proc in reversed(list(self.components.values())):
            proc.stop()


def _environment(code: Path, run_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _OWN_VARIABLES and not k.startswith("GPUCLOUD_")}
    env.update(
        PYTHONPATH=str(code),
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="gpucloud.settings",
        GPUCLOUD_DATA_DIR=str(run_dir / "data"),
        GPUCLOUD_AGENT_PROCESS_RUNTIME="1",
        GPUCLOUD_AGENT_PULL_IMAGES="0",
        # The harness registers its nodes itself: a first `gpucloud up` must not register `local` before it.
        GPUCLOUD_LOCAL_NODE="off",
        # Jupyter from the suite's own interpreter, as the workload's user can run it (a root agent runs
        # workloads as an unprivileged user): the process runtime gives workloads a minimal PATH.
        NOTEBOOK_COMMAND=",".join([*_workload_python(code), "-m", "jupyterlab"]),
    )
    # Notebooks on a port of their own, chosen free here: the CLI's default (the console's port + 1) may be
    # another process's, e.g. a parallel test worker's.
    env["NOTEBOOK_ORIGIN"] = f"http://127.0.0.1:{free_port()}"
    env.update(extra)
    return env


def _workload_python(code: Path) -> list[str]:
    """Return the command prefix that runs this Python as a workload's user: the tests' rule (tests/process_user.py)."""
    spec = importlib.util.spec_from_file_location("_process_user", code / "tests" / "process_user.py")
    assert spec is not None and spec.loader is not None, f"no tests/process_user.py in {code}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    prefix: list[str] = module.workload_python()
    return prefix


def _launch(*args: str) -> list[str]:
    return [PYTHON, str(LAUNCH), *args]


def embedded(code: Path, run_dir: Path, *, gpus: int = 8, extra: dict[str, str] | None = None) -> Topology:
    """Return the embedded console of `code`: `gpucloud up` with node `local` of `gpus` simulated GPUs."""
    port = free_port()
    env = _environment(code, run_dir, {"GPUCLOUD_NODE_NAME": "local", **(extra or {})})
    top = Topology(code=code, run_dir=run_dir, mode="embedded", nodes=[("local", gpus)], env=env, port=port)
    argv = _launch("--queue-samples", str(top.queue_samples), "--simulated-gpus", str(gpus))
    argv += ["--", "up", "--host", "127.0.0.1", "--port", str(port)]
    top.components["console"] = Proc("console", argv, env=env, cwd=code, log_dir=run_dir)
    return top


def _has_beat_command(code: Path) -> bool:
    return 'add_parser("beat"' in (code / "gpucloud" / "cli.py").read_text()


def distributed(
    code: Path,
    run_dir: Path,
    *,
    database_url: str,
    redis_url: str,
    nodes: list[tuple[str, int]],
    worker_queues: str | None = None,
    runtime: str = "process",
    extra: dict[str, str] | None = None,
) -> Topology:
    """Return the distributed console of `code` on `database_url` and `redis_url`, one agent per node."""
    port = free_port()
    secret = secrets.token_urlsafe(48)
    env = _environment(code, run_dir, {"DATABASE_URL": database_url, "REDIS_URL": redis_url, "SECRET_KEY": secret})
    env.update(extra or {})
    top = Topology(code=code, run_dir=run_dir, mode="distributed", nodes=nodes, env=env, port=port, runtime=runtime)
    top.database_url, top.redis_url = database_url, redis_url

    def add(name: str, *command: str) -> None:
        top.components[name] = Proc(name, _launch("--", *command), env=env, cwd=code, log_dir=run_dir)

    add("web", "serve", "--host", "127.0.0.1", "--port", str(port))
    add("worker", "worker", *(["--queues", worker_queues] if worker_queues else []))
    if _has_beat_command(code):
        add("beat", "beat")
    else:
        # This CLI runs beat only inside a worker: give that worker a queue nobody sends to.
        add("beat", "worker", "--beat", "--queues", "faults.beat-only")
    for node, count in nodes:
        add(
            f"agent-{node}",
            "agent",
            "--node",
            node,
            "--probe",
            "simulated",
            "--simulated-gpus",
            str(count),
            "--allow-process-runtime",
        )
    return top
