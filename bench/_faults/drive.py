"""How a run drives work through the console and breaks it: a kill and restart, or a starved CPU."""

from __future__ import annotations

import re
import time

from _faults.procs import Busy, wait_until
from _faults.stage import Stage

JOB_INTERVAL = 2.0
BURST = 4
DURING_OUTAGE = 2


class Drive(Stage):
    """The work submitted around the fault, the fault itself and the repair (`drive_kill`, `drive_starve`)."""

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

    def _exited_while_engine_down(self) -> frozenset[tuple[str, int]]:
        """Return the (job, attempt) whose container exited while the private Docker Engine was down."""
        if self.docker is None or self.down_window is None or self.submitter is None:
            return frozenset()
        begin, end = self.down_window
        names = {workload_id: name for name, workload_id in self.submitter.accepted.items()}
        found = set()
        for container, finished in self.docker.finished_at().items():
            # `policy.container_name`: gpucloud-<installation tag>-w<id>-r<replica>-a<attempt>.
            match = re.fullmatch(r"gpucloud-[0-9a-f]{8}-w(\d+)-r\d+-a(\d+)", container)
            if match and int(match[1]) in names and begin <= finished <= end:
                found.add((names[int(match[1])], int(match[2])))
        return frozenset(found)
