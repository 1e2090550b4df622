"""A fault run's state, and the fresh console it sets up and tears down (`scenarios.Run` drives and measures it)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from _faults.catalog import DOCKER_IMAGE, Fault, Settings
from _faults.observe import Observer, QueueSampler
from _faults.procs import wait_until
from _faults.services import (
    PrivateDocker,
    PrivatePostgres,
    PrivateRedis,
    drop_database,
    flush_redis,
    fresh_database,
)
from _faults.topology import Topology, distributed, embedded
from _faults.truth import Design, running_processes
from _faults.world import Api, Submitter, bootstrap

ROOT = Path(__file__).resolve().parents[2]


class Stage:
    """A run's state: a fresh console and its servers after `setup`; `teardown` leaves nothing running."""

    def __init__(self, fault: Fault, settings: Settings, plan: list[Design]) -> None:
        self.fault = fault
        self.settings = settings
        self.log = settings.log
        self.run_id = f"{fault.name}-{secrets.token_hex(3)}"
        self.run_dir = settings.work_root / self.run_id
        self.proof_dir = self.run_dir / "proof"
        self.proof_dir.mkdir(parents=True)
        self.designs = {design.name: design for design in plan}
        self.extra: dict[str, Any] = {}
        self.redis: PrivateRedis | None = None
        self.docker: PrivateDocker | None = None
        self.down_window: tuple[float, float] | None = None  # wall clock: the component killed, restarted
        self.exited_while_down: frozenset[tuple[str, int]] = frozenset()  # (job, attempt), docker-restart
        self.image: str | None = None
        self.postgres: PrivatePostgres | None = None
        self.top: Topology | None = None
        self.observer: Observer | None = None
        self.sampler: QueueSampler | None = None
        self.submitter: Submitter | None = None
        self.owner: Api | None = None
        self.fault_end: float | None = None

    # --- set-up ----------------------------------------------------------------------------------------

    def setup(self) -> None:
        started = time.monotonic()
        self.top = self._topology()
        self.log(f"[{self.run_id}] bootstrap ({self.top.mode}, code {self.settings.code})")
        tokens = bootstrap(code=self.settings.code, env=self.top.env, gpus=self.top.gpus)
        self.top.start()
        operator = Api(self.top.console, tokens["operator"])
        for node, count in self.top.nodes:
            found = operator.add_node(node, runtime=self.top.runtime, timeout=300)
            if found != count:
                raise RuntimeError(f"node {node} has {found} GPUs, not {count}")
        self.owner = Api(self.top.console, tokens["owner"])
        self.observer = Observer(self.top.ledger(), self.designs, self.run_id)
        self.observer.start()
        self.sampler = QueueSampler(redis_url=self.top.redis_url, samples_file=None)
        if self.top.mode == "embedded":
            self.sampler = QueueSampler(samples_file=self.top.queue_samples)
        self.sampler.start()
        patience = self.settings.observe_max
        api = Api(self.top.console, tokens["owner"])
        self.submitter = Submitter(api, self.run_id, self.proof_dir, patience, self.image)
        self.extra["setup_s"] = round(time.monotonic() - started, 1)
        self.log(f"[{self.run_id}] ready in {self.extra['setup_s']} s: {self.top.console}, {self.top.gpus} GPUs")

    def _topology(self) -> Topology:
        settings, fault = self.settings, self.fault
        if fault.mode == "embedded":
            return embedded(settings.code, self.run_dir, gpus=settings.embedded_gpus, extra=settings.extra_env)
        redis_url = settings.redis_url
        if fault.private == "redis":
            self.redis = PrivateRedis(self.run_dir)
            self.redis.start()
            redis_url = self.redis.url
        flush_redis(redis_url)
        server = settings.database_server
        if fault.private == "postgres":
            self.postgres = PrivatePostgres()
            self.postgres.start()
            server = self.postgres.url
        database = fresh_database(server, settings.database_prefix + fault.name.replace("-", "_"))
        nodes = [(f"fa-{i}", settings.node_gpus) for i in range(1, settings.distributed_nodes + 1)]
        runtime, extra = "process", dict(settings.extra_env)
        if fault.private == "docker":
            # Jobs in containers of the test image, CPU only: a Docker node with GPUs needs the NVIDIA toolkit.
            self.docker = PrivateDocker(self.run_dir)
            self.docker.start()
            self.docker.build_image(ROOT / ".ci" / "build-test-image", DOCKER_IMAGE)
            self.image, runtime, nodes = DOCKER_IMAGE, "docker", [("fd-1", 0)]
            extra.update(DOCKER_HOST=self.docker.url, GPUCLOUD_HEALTHCHECK_IMAGE=DOCKER_IMAGE)
        return distributed(
            settings.code,
            self.run_dir,
            database_url=database,
            redis_url=redis_url,
            nodes=nodes,
            worker_queues=settings.worker_queues,
            runtime=runtime,
            extra=extra,
        )

    # --- teardown ----------------------------------------------------------------------------------------

    def teardown(self, result: dict[str, Any] | None) -> None:
        """Cancel the notebooks, stop every component and server, kill what is left of the run's workloads."""
        with contextlib.suppress(Exception):
            if self.observer is not None:
                self.observer.stop()
        with contextlib.suppress(Exception):
            if self.sampler is not None:
                self.sampler.stop()
        stopped = None
        if self.top is not None and self.owner is not None and self.submitter is not None and self.top.healthy():
            stopped = self._cancel_notebooks()
        if self.top is not None:
            self.top.stop()
        left = running_processes(self.run_id)
        for pids in left.values():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if self.redis is not None:
            self.redis.stop()
        if self.docker is not None:
            self.docker.stop()
        if self.postgres is not None:
            self.postgres.stop()
        elif self.top is not None and self.top.database_url and not self.settings.keep:
            drop_database(self.top.database_url)
        if result is not None:
            result["teardown"] = {"notebooks_stopped_by_cancel": stopped, "killed_after_stop": len(left)}
            result["run_dir"] = str(self.run_dir) if self.settings.keep else None
        if not self.settings.keep:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _cancel_notebooks(self) -> str:
        assert self.owner is not None and self.submitter is not None
        ids = {i for n, i in self.submitter.accepted.items() if self.designs[n].kind == "notebook"}
        for workload_id in ids:
            with contextlib.suppress(Exception):
                self.owner.cancel(workload_id)
        wait_until(lambda: not (ids & {w for w, _ in running_processes(self.run_id)}), 45, interval=1)
        still = ids & {w for w, _ in running_processes(self.run_id)}
        return f"{len(ids) - len(still)}/{len(ids)}"
