"""A fault run's figures, and the table of several.

Per fault:

- `lost`: accepted workloads that never reached a final state: a job not
  ended (or "running" with no process left), a notebook neither running
  nor ended, when the observation stopped;
- `falsely_failed`: a job whose command exits 0 that ended failed, lost or
  cancelled; a notebook that ended at all (nothing stops one before the
  teardown); `wrong_state` also counts jobs meant to fail that ended
  otherwise than failed;
- `orphans`: processes of the run still alive at the end that the ledger
  does not run (its workload not scheduled/starting/running, or another
  attempt), checked after the observation (at least two reconcile periods
  after the fault by default);
- `double_allocations`: GPUs seen with two active allocations, plus the
  most allocated GPUs above what a node has;
- `log_lines_lost`: for every attempt of a job that ran to its end (its
  proof file), the expected lines missing from what the logs endpoint
  returns for that attempt once the observation ends (lines still on their
  way are waited for until `observe_max` after the fault);
  `log_lines_lost_exited_while_engine_down` (docker-restart): those of them
  lost from containers that exited while their Docker Engine was down,
  whose output the restarted engine never reads (a Docker limitation: a
  container still running at the restart keeps all of it);
- `converge_s`: seconds from the fault's end to the poll from which no
  invariant was broken until the end (None: never, or not at the end);
- `restart_to_running_s`: seconds from the restart until every workload
  submitted and not ended when the component went down (pending,
  scheduled, starting or running) ran again, or truly ended;
- `max_queued_control_tasks`: the longest `control` queue sampled (Redis
  `LLEN control`; embedded: the transport's queue plus the messages the
  console's workers took and have not started).
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from _faults.ledger import TERMINAL, Snapshot
from _faults.truth import Design, completed_attempts

TARGET_CONVERGE_S = 30.0


def _code_version(code: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        run = subprocess.run(["git", "-C", str(code), *args], capture_output=True, text=True, check=False)
        return run.stdout.strip()

    dirty = bool(git("status", "--short", "--untracked-files=no"))
    return {"path": str(code), "commit": git("rev-parse", "--short", "HEAD"), "dirty": dirty}


def _states(designs: dict[str, Design], accepted: dict[str, int], final: Snapshot | None) -> dict[str, list[str]]:
    lost, false, wrong = [], [], []
    workloads = final.workloads if final else {}
    for name in accepted:
        design, row = designs[name], workloads.get(name)
        if row is None or (row.state not in TERMINAL and row.state != "running"):
            lost.append(name)
        elif row.state == "running" and design.kind == "job":
            lost.append(name)  # outlived the observation: stuck, or its end never reached the ledger
        elif row.state in TERMINAL and row.state != design.true_state:
            wrong.append(name)
            if design.kind == "notebook" or design.exit_code == 0:
                false.append(name)
    return {"lost": lost, "falsely_failed": false, "wrong_state": wrong}


def log_lines_missing(
    designs: dict[str, Design],
    final: Snapshot | None,
    logs: dict[str, list[dict[str, Any]]] | None,
    proof_dir: Path,
) -> int:
    """Return how many expected lines of finished attempts `logs` lacks (0 when they could not be read)."""
    return int(_log_figures(designs, final, logs, proof_dir)["log_lines_lost"] or 0)


def _log_figures(
    designs: dict[str, Design],
    final: Snapshot | None,
    logs: dict[str, list[dict[str, Any]]] | None,
    proof_dir: Path,
    exited_while_down: frozenset[tuple[str, int]] = frozenset(),
) -> dict[str, Any]:
    if logs is None:
        return {"log_lines_lost": None, "log_lines_expected": None, "log_lines_duplicated": None}
    expected_total = lost_total = duplicated = lost_engine_down = 0
    per_job: dict[str, int] = {}
    doubled: dict[str, list[str]] = {}
    for name, lines in logs.items():
        design = designs[name]
        attempts = completed_attempts(proof_dir, name)
        row = final.workloads.get(name) if final else None
        if not attempts and row is not None and row.state == design.true_state and row.exit_code == design.exit_code:
            # No proof file (a container cannot write one): the ledger's attempt, if it says the command ran out.
            attempts = {row.attempt: design.exit_code}
        for attempt in attempts:
            expected = design.expected_lines()
            stored = Counter((line["stream"], line["text"]) for line in lines if line.get("attempt") == attempt)
            missing = sum((expected - stored).values())
            expected_total += sum(expected.values())
            lost_total += missing
            extra = stored - expected
            duplicated += sum(extra.values())
            if extra:
                doubled[f"{name}/a{attempt}"] = sorted(text for (_, text), count in extra.items() for _ in range(count))
            if missing:
                per_job[f"{name}/a{attempt}"] = missing
            if (name, attempt) in exited_while_down:
                lost_engine_down += missing
    return {
        "log_lines_lost": lost_total,
        "log_lines_lost_exited_while_engine_down": lost_engine_down,
        "log_lines_expected": expected_total,
        "log_lines_duplicated": duplicated,
        "log_lines_lost_by_job": per_job,
        "log_lines_duplicated_by_job": doubled,
    }


def summarize(**run: Any) -> dict[str, Any]:
    """Return the figures of one run (the keyword arguments are `scenarios.Run.measure`'s)."""
    designs: dict[str, Design] = run["designs"]
    final: Snapshot | None = run["final"]
    observer = run["observer"]
    extra: dict[str, Any] = dict(run["extra"])
    states = _states(designs, run["accepted"], final)
    rows = final.workloads if final else {}
    watch = extra.pop("watch", None)
    restart_to_running = None
    if watch is not None and watch.done_at is not None:
        restart_to_running = round(watch.done_at - watch.since, 1)
    details = []
    for name in states["wrong_state"]:
        row = rows[name]
        details.append(
            {
                "name": name,
                "state": row.state,
                "reason": row.reason_code,
                "exit_code": row.exit_code,
                "attempt": row.attempt,
                "served": name in observer.ever_served if designs[name].kind == "notebook" else None,
                "ran_to_end": completed_attempts(run["proof_dir"], name) or None,
            }
        )
    queues: dict[str, int] = run["queues"]
    result: dict[str, Any] = {
        "fault": run["fault"].name,
        "about": run["fault"].about,
        "mode": run["fault"].mode,
        "code": _code_version(run["code"]),
        "workloads": {
            "jobs": sum(d.kind == "job" for d in designs.values()),
            "notebooks": sum(d.kind == "notebook" for d in designs.values()),
            "accepted": len(run["accepted"]),
            "never_accepted": run["never_accepted"],
            "submit_retries": run["submit_retries"],
            "reruns": sorted(n for n, row in rows.items() if row.attempt > 1 and n in designs),
        },
        "lost": len(states["lost"]),
        "falsely_failed": len(states["falsely_failed"]),
        "wrong_state": len(states["wrong_state"]),
        "orphans": len(run["orphans"]),
        "double_allocations": len(observer.double_allocated_gpus) + observer.over_allocation_max,
        **_log_figures(designs, final, run["logs"], run["proof_dir"], run.get("exited_while_down", frozenset())),
        "converge_s": observer.converge_seconds(),
        "restart_to_running_s": restart_to_running,
        "max_queued_control_tasks": queues.get("control"),
        "max_queue_lengths": queues,
        "lost_names": states["lost"],
        "wrong_state_detail": details,
        "orphans_detail": [f"w{w}/a{a}" for w, a in run["orphans"]],
        "orphans_seen_during_run": len(observer.orphans_seen),
        "violations_at_end": observer.violations[:30],
        "violation_polls": dict(observer.violation_counts),
        "polls": observer.polls,
        "unreadable_polls": observer.unreadable_polls,
        "unreadable_error": observer.unreadable_error or None,
        "gpus": run["gpus"],
        **extra,
    }
    result["targets_met"] = targets_met(result)
    return result


def targets_met(result: dict[str, Any]) -> bool:
    """Return whether a run met the issue's targets: 0 of each count, converged within 30 s."""
    if "error" in result:
        return False
    zero = ("lost", "falsely_failed", "orphans", "double_allocations", "log_lines_lost")
    converge = result.get("converge_s")
    return all(result.get(key) == 0 for key in zero) and converge is not None and converge <= TARGET_CONVERGE_S


_COLUMNS = (
    ("fault", "fault"),
    ("lost", "lost"),
    ("falsely_failed", "false fail"),
    ("orphans", "orphans"),
    ("double_allocations", "double alloc"),
    ("log_lines_lost", "log lost"),
    ("converge_s", "converge s"),
    ("restart_to_running_s", "restart->running s"),
    ("max_queued_control_tasks", "max queued control"),
    ("targets_met", "met"),
)


def table(results: list[dict[str, Any]]) -> str:
    """Return a plain-text table of the headline figures, one fault per row."""

    def cell(result: dict[str, Any], key: str) -> str:
        if "skipped" in result and key != "fault":
            return "skipped"
        if "error" in result and key not in ("fault", "targets_met"):
            return "error"
        value = result.get(key)
        if value is None:
            return "never" if key == "converge_s" else "-"
        return "yes" if value is True else "NO" if value is False else str(value)

    rows = [[title for _, title in _COLUMNS]] + [[cell(r, key) for key, _ in _COLUMNS] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
