"""The runner that sets a console up, drives work through it, injects one fault and measures.

Every run: fresh data (a scratch SQLite directory, or a scratch Postgres
database `gpucloud_faults_<fault>` and the suite's Redis database), the
accounts (`world.bootstrap`), the components started, the nodes registered
and provisioned through the API, then:

- kill and restart faults: notebooks first (running and serving before
  anything breaks), then batch jobs one every 2 s, a burst just before the
  fault (passes and launches in flight while earlier jobs stream their
  logs), the component SIGKILLed with its whole process group (or Redis
  SIGKILLed, or Postgres stopped in immediate mode), down for `down`
  seconds while the client keeps submitting (retrying with its
  Idempotency-Key), then started again: that instant is the fault's end;
- the CPU-starve fault: two processes spinning beside the embedded console
  for `starve_minutes`, the jobs submitted evenly across them; the fault
  ends when the spinners stop.

Then it observes until every workload settled (each job ended, each
notebook serving, no invariant broken) and at least `observe_min`
seconds (two reconcile periods by default) passed since the fault's end, or
`observe_max` passed, and measures (see `report`).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from _faults import report
from _faults.catalog import DOCKER_IMAGE, FAULTS, Fault, Settings, plan_for
from _faults.ledger import ACTIVE, TERMINAL, Snapshot, WorkloadRow
from _faults.observe import Observer, QueueSampler
from _faults.procs import Busy, wait_until
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
from _faults.world import Api, Submitter, bootstrap, browser_session, proxy_serves

ROOT = Path(__file__).resolve().parents[2]
JOB_INTERVAL = 2.0
BURST = 4
DURING_OUTAGE = 2


class Run:
    """One fault run, from a fresh console to its figures; `teardown` leaves nothing running."""

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

    # --- driving work and the fault -------------------------------------------------------------------

    def _wait_for_notebooks(self, timeout: float) -> None:
        observer = self.observer
        assert observer is not None
        names = [name for name, design in self.designs.items() if design.kind == "notebook"]
        started = time.monotonic()
        serving = wait_until(lambda: all(observer.serving.get(n) for n in names), timeout, interval=1)
        self.extra["notebooks_serving_before_fault_s"] = round(time.monotonic() - started, 1) if serving else None
        self.log(f"[{self.run_id}] notebooks serving: {serving} after {time.monotonic() - started:.0f} s")

    def drive_kill(self) -> None:
        """Notebooks, a stream of jobs, a burst, the fault in the middle of it, down `down` s, the restart."""
        assert self.submitter is not None and self.observer is not None
        notebooks = [d for d in self.designs.values() if d.kind == "notebook"]
        jobs = [d for d in self.designs.values() if d.kind == "job"]
        for design in notebooks:
            self.submitter.plan(design, time.monotonic())
        self._wait_for_notebooks(timeout=240)
        lead = jobs[: max(0, len(jobs) - BURST - DURING_OUTAGE)]
        burst = jobs[len(lead) : len(lead) + BURST]
        during = jobs[len(lead) + BURST :]
        begin = time.monotonic()
        for i, design in enumerate(lead):
            self.submitter.plan(design, begin + i * JOB_INTERVAL)
        burst_at = begin + len(lead) * JOB_INTERVAL
        for design in burst:
            self.submitter.plan(design, burst_at)
        fault_at = burst_at + 0.7
        for design in during:
            self.submitter.plan(design, fault_at + self.settings.down / 2)
        time.sleep(max(0.0, fault_at - time.monotonic()))
        target = self._target()
        assert self.top is not None
        ledger = self.top.ledger()
        try:
            watch = self.observer.watch_unfinished(ledger.snapshot(), since=float("inf"))
        finally:
            ledger.close()
        self.log(f"[{self.run_id}] fault: {self.fault.about} ({target}); {len(watch.names)} workloads not ended")
        killed_at = time.monotonic()
        self.down_window = (time.time(), float("inf"))
        self._break(target)
        time.sleep(self.settings.down)
        restarted_at = time.monotonic()
        self._repair(target)
        self.down_window = (self.down_window[0], time.time())
        # Read now: ended containers are removed once reconcile has their output.
        self.exited_while_down = self._exited_while_engine_down()
        watch.since = restarted_at
        self.observer.mark_fault_end()
        self.fault_end = restarted_at
        self.extra["down_s"] = round(restarted_at - killed_at, 1)
        self.extra["unfinished_at_fault"] = len(watch.names)
        self.extra["watch"] = watch
        if wait_until(self.top.healthy, 120, interval=0.2):
            self.extra["restart_to_healthy_s"] = round(time.monotonic() - restarted_at, 1)

    def drive_starve(self) -> None:
        """Two spinning processes beside the console; notebooks and jobs submitted while they spin."""
        assert self.submitter is not None and self.observer is not None and self.sampler is not None
        busy = Busy(2)
        busy.start()
        began = time.monotonic()
        length = self.settings.starve_minutes * 60
        self.log(f"[{self.run_id}] starving the CPU for {length:.0f} s")
        jobs = [d for d in self.designs.values() if d.kind == "job"]
        for design in self.designs.values():
            if design.kind == "notebook":
                self.submitter.plan(design, began + 5)
        span = max(30.0, length - 120)
        for i, design in enumerate(jobs):
            self.submitter.plan(design, began + 10 + i * span / max(1, len(jobs)))
        try:
            while (left := began + length - time.monotonic()) > 0:
                time.sleep(min(60.0, left))
                self._progress()
        finally:
            busy.stop()
        self.observer.mark_fault_end()
        self.fault_end = time.monotonic()

    def _progress(self) -> None:
        assert self.observer is not None
        snap = self.observer.last
        states: dict[str, int] = {}
        for row in snap.workloads.values() if snap else []:
            states[row.state] = states.get(row.state, 0) + 1
        self.log(f"[{self.run_id}] {time.strftime('%H:%M:%S')} states {states}")

    def _target(self) -> str:
        assert self.top is not None and self.observer is not None
        if self.fault.target != "agent":
            return self.fault.target
        snap = self.observer.last
        held: dict[str, int] = {name: 0 for name, _ in self.top.nodes}
        for _, _, node_id in snap.allocations if snap else []:
            name = snap.nodes[node_id][0] if snap else ""
            held[name] = held.get(name, 0) + 1
        return f"agent-{max(held, key=lambda name: held[name])}"

    def _break(self, target: str) -> None:
        assert self.top is not None
        if target == "docker":
            assert self.docker is not None
            self.docker.kill9()
        elif target == "redis":
            assert self.redis is not None
            self.redis.kill9()
        elif target == "postgres":
            assert self.postgres is not None
            self.postgres.crash()
        else:
            self.top.components[target].kill9()

    def _repair(self, target: str) -> None:
        assert self.top is not None
        if target == "docker":
            assert self.docker is not None
            self.docker.start()
        elif target == "redis":
            assert self.redis is not None
            self.redis.start()
        elif target == "postgres":
            assert self.postgres is not None
            self.postgres.restart_after_crash()
        else:
            self.top.components[target].start()

    # --- observing and measuring -------------------------------------------------------------------------

    def observe(self) -> None:
        """Wait until everything settled and `observe_min` passed since the fault's end, or `observe_max`."""
        assert self.observer is not None and self.submitter is not None and self.fault_end is not None
        self.submitter.close(timeout=self.settings.observe_max)
        minimum = self.fault_end + self.settings.observe_min
        maximum = self.fault_end + self.settings.observe_max
        while time.monotonic() < maximum:
            if time.monotonic() >= minimum and self._settled():
                break
            time.sleep(1)
        time.sleep(1.5)  # one more poll after the last change
        self.extra["observed_after_fault_s"] = round(time.monotonic() - self.fault_end, 1)

    def _settled(self) -> bool:
        assert self.observer is not None and self.submitter is not None
        snap = self.observer.last
        if snap is None or self.observer.violations:
            return False
        submitted = self.submitter.accepted.keys() | set(self.submitter.never_accepted)
        if not submitted >= self.designs.keys():
            return False
        # Settled means every workload where it ends up: a job ended, a notebook serving. Stopping earlier
        # would count a job still queued for GPUs, or whose exit is on its way, as lost.
        return all(_at_rest(self.designs[name].kind, snap.workloads.get(name)) for name in self.submitter.accepted)

    def measure(self) -> dict[str, Any]:
        assert self.observer is not None and self.sampler is not None and self.top is not None
        assert self.submitter is not None and self.owner is not None
        final = self.observer.last
        orphans = sorted(self.observer.last_processes.keys() - _run_by_ledger(final))
        self.observer.stop()
        self.sampler.stop()
        console_up = wait_until(self.top.healthy, 60, interval=0.5)
        logs = self._complete_logs(final) if console_up else None
        self.extra["notebooks_through_proxy"] = self._proxy() if console_up else None
        if console_up:
            with contextlib.suppress(Exception):
                self.extra["pool_free_api"] = self.owner.pool_free()
        return report.summarize(
            fault=self.fault,
            run_id=self.run_id,
            code=self.settings.code,
            designs=self.designs,
            accepted=self.submitter.accepted,
            never_accepted=self.submitter.never_accepted,
            submit_retries=self.submitter.failed_tries,
            observer=self.observer,
            final=final,
            orphans=orphans,
            logs=logs,
            proof_dir=self.proof_dir,
            queues=self.sampler.maxima(),
            exited_while_down=self.exited_while_down,
            extra=self.extra,
            gpus=self.top.gpus,
        )

    def _exited_while_engine_down(self) -> frozenset[tuple[str, int]]:
        """Return the (job, attempt) whose container exited while the private Docker Engine was down."""
        if self.docker is None or self.down_window is None or self.submitter is None:
            return frozenset()
        begin, end = self.down_window
        names = {workload_id: name for name, workload_id in self.submitter.accepted.items()}
        found = set()
        for container, finished in self.docker.finished_at().items():
            match = re.fullmatch(r"gpucloud-w(\d+)-r\d+-a(\d+)", container)
            if match and int(match[1]) in names and begin <= finished <= end:
                found.add((names[int(match[1])], int(match[2])))
        return frozenset(found)

    def _complete_logs(self, final: Snapshot | None) -> dict[str, list[dict[str, Any]]] | None:
        """Return the jobs' stored lines once none of a finished attempt is missing, or when observing ends.

        A job's exit report and its last lines travel on separate queues, so
        the lines may be stored a moment after the ledger says it ended; what
        is still missing at the end of the observation (`observe_max` after
        the fault) counts as lost.
        """
        assert self.fault_end is not None
        deadline = max(self.fault_end + self.settings.observe_max, time.monotonic())
        while True:
            logs = self._logs()
            missing = report.log_lines_missing(self.designs, final, logs, self.proof_dir)
            if logs is None or not missing or time.monotonic() >= deadline:
                return logs
            time.sleep(1)

    def _logs(self) -> dict[str, list[dict[str, Any]]] | None:
        assert self.owner is not None and self.submitter is not None
        found = {}
        for name, workload_id in self.submitter.accepted.items():
            if self.designs[name].kind == "job":
                try:
                    found[name] = self.owner.log_lines(workload_id)
                except Exception as error:  # reported, not raised: the other figures still count
                    self.log(f"[{self.run_id}] logs of {name}: {error}")
                    return None
        return found

    def _proxy(self) -> str | None:
        assert self.top is not None and self.submitter is not None
        notebooks = [(n, i) for n, i in self.submitter.accepted.items() if self.designs[n].kind == "notebook"]
        if not notebooks:
            return None
        try:
            session = browser_session(self.top.console)
        except Exception as error:  # a diagnostic figure
            return f"login failed: {error}"
        return f"{sum(proxy_serves(session, i) for _, i in notebooks)}/{len(notebooks)}"

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


def _run_by_ledger(snap: Any) -> set[tuple[int, int]]:
    if snap is None:
        return set()
    return {(row.id, row.attempt) for row in snap.workloads.values() if row.state in ACTIVE}


def run_fault(name: str, settings: Settings) -> dict[str, Any]:
    """Run fault `name` on a fresh console of `settings.code`; return its figures (see `report.summarize`)."""
    fault = FAULTS[name]
    run = Run(fault, settings, plan_for(fault, settings))
    result: dict[str, Any] | None = None
    try:
        run.setup()
        if fault.action == "starve":
            run.drive_starve()
        else:
            run.drive_kill()
        run.observe()
        result = run.measure()
        return result
    except Exception as error:
        tails = {n: p.tail(30) for n, p in (run.top.components.items() if run.top else [])}
        result = {"fault": name, "error": f"{type(error).__name__}: {error}", "logs": tails}
        return result
    finally:
        run.teardown(result)


def _at_rest(kind: str, row: WorkloadRow | None) -> bool:
    """Whether a workload reached where it stays: a job ended, a notebook serving (or ended)."""
    if row is None:
        return False
    return row.state in TERMINAL or (kind == "notebook" and row.state == "running")
