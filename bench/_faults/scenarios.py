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

`Run` is assembled from `stage` (its state, the set-up and the teardown),
`drive` (the work and the fault) and `measure` (the settling and the figures).
"""

from __future__ import annotations

from typing import Any

from _faults.catalog import FAULTS, Settings, plan_for
from _faults.drive import Drive
from _faults.measure import Measure

__all__ = ["Run", "run_fault"]


class Run(Drive, Measure):
    """One fault run, from a fresh console to its figures; `teardown` leaves nothing running."""


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
