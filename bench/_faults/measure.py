"""How a run waits for the console to settle after the fault, and gathers what `report` needs to measure it."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from _faults import report
from _faults.ledger import ACTIVE, TERMINAL, Snapshot, WorkloadRow
from _faults.procs import wait_until
from _faults.stage import Stage
from _faults.world import browser_session, proxy_serves


class Measure(Stage):
    """Observing after the fault (`observe`) and the run's figures (`measure`)."""

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


def _run_by_ledger(snap: Any) -> set[tuple[int, int]]:
    if snap is None:
        return set()
    return {(row.id, row.attempt) for row in snap.workloads.values() if row.state in ACTIVE}


def _at_rest(kind: str, row: WorkloadRow | None) -> bool:
    """Whether a workload reached where it stays: a job ended, a notebook serving (or ended)."""
    if row is None:
        return False
    return row.state in TERMINAL or (kind == "notebook" and row.state == "running")
