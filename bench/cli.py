"""`gpc` as a user meets it: start-up, `submit --wait` of a 1-second job against curl, `logs -f` at 10,000 lines/s.

    .venv/bin/python bench/cli.py [--startup-runs 20] [--wait-runs 5] [--rate 10000] [--seconds 10]

Embedded mode in a scratch directory, as bench/notebook_start.py sets it up (whose helpers this reuses): the
controller's workers and the agent of node `bench-local` (process runtime: jobs really run) in this process,
the console's ASGI application under uvicorn on a loopback port, and a scheduling pass asked for every
SCHEDULER_PASS_SECONDS as the console's beat does. `gpc` is the installed console script, configured by the
environment alone (GPUCLOUD_URL, GPUCLOUD_TOKEN, GPUCLOUD_TENANT, GPUCLOUD_PROJECT) with an API token of the
bench tenant's owner.

(a) `gpc --help`: wall time of the whole process, median of `--startup-runs` (the target is 150 ms); the
    bare interpreter (`python -c pass`) beside it for reference.
(b) A job running `sleep 1`, from the command to knowing it ended: `gpc submit --wait` against curl (POST the
    submission, then GET its detail every 0.1 s until it ended, one curl process per request, as a shell
    script would), alternated, median of `--wait-runs` each. Between runs the bench waits, untimed, for the
    node's GPU to be released, so every run starts from an idle node.
(c) `gpc logs -f` on a job writing `--rate` numbered lines a second for `--seconds`: lines lost (expected
    against received, with duplicates and order checked), what the console stored, the follower's CPU
    seconds (its rusage, from wait4) and how long after the job ended it finished.

Prints a table. Machine figures: on a 2-core machine the console, its workers and the job share the cores
with the client being measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from execution_start import _setup_django
from notebook_resume import _released
from notebook_start import _start, _world

GPC = Path(sys.executable).with_name("gpc")
IMAGE = "registry.local/bench/job:1"
ENDED = {"succeeded", "failed", "cancelled", "lost"}
POLL_SECONDS = 0.1  # how often the curl script reads the workload
LIMIT_S = 180.0
# Writes argv[1] lines a second for argv[2] seconds, numbered from 1, flushed as they are due.
WRITER = """
import sys, time
rate, seconds = int(sys.argv[1]), float(sys.argv[2])
total, written, start = int(rate * seconds), 0, time.monotonic()
while written < total:
    due = min(total, int((time.monotonic() - start) * rate))
    if due > written:
        sys.stdout.write("".join(f"{n}\\n" for n in range(written + 1, due + 1)))
        sys.stdout.flush()
        written = due
    else:
        time.sleep(0.001)
"""


@dataclass(frozen=True)
class Console:
    """The console this bench started: its URL, and what `gpc` and curl need to act as the bench's owner."""

    url: str
    token: str
    env: dict[str, str]


def _console(scratch: Path) -> Console:
    """Start the embedded console (see the module) and return how to reach it."""
    _setup_django(scratch)
    user, _project, _pool = _world()
    from tenants.context import Actor
    from tenants.models import Tenant
    from tenants.services.tokens import create_token

    tenant = Tenant.objects.get(slug="bench")
    token = create_token(actor=Actor(user=user), tenant=tenant, name="bench", expires_in_days=1).secret  # type: ignore[arg-type]
    url = _start(scratch / "agent")
    _periodic_passes()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCLOUD_")}
    env.update(
        GPUCLOUD_CONFIG=str(scratch / "gpc.yaml"),  # none: the environment alone says where and who
        GPUCLOUD_URL=url,
        GPUCLOUD_TOKEN=token,
        GPUCLOUD_TENANT="bench",
        GPUCLOUD_PROJECT="bench",
        NO_COLOR="1",
    )
    return Console(url, token, env)


def _periodic_passes() -> None:
    """Ask for a scheduling pass every SCHEDULER_PASS_SECONDS on a daemon thread, as beat does."""
    from django.conf import settings

    from jobs.triggers import enqueue_scheduling_pass

    def tick() -> None:
        while True:
            time.sleep(float(settings.SCHEDULER_PASS_SECONDS))
            enqueue_scheduling_pass()

    threading.Thread(target=tick, name="periodic-passes", daemon=True).start()


def _timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=LIMIT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:3]} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done


# --- (a) start-up ---------------------------------------------------------------------------


def startup(runs: int) -> dict[str, float]:
    """Return the median seconds of `gpc --help` and of a bare `python -c pass`."""
    gpc = [_timed(lambda: _run([str(GPC), "--help"])) for _ in range(runs)]
    bare = [_timed(lambda: _run([sys.executable, "-c", "pass"])) for _ in range(runs)]
    return {"gpc": statistics.median(gpc), "python": statistics.median(bare), "gpc_max": max(gpc)}


def one_call(console: Console, runs: int) -> float:
    """Return the median seconds of `gpc whoami`: the client's fixed cost of a command that makes one API call."""
    return statistics.median(_timed(lambda: _run([str(GPC), "whoami"], console.env)) for _ in range(runs))


# --- (b) submit and wait ----------------------------------------------------------------------


def _idle(workload_id: int) -> None:
    """Return once the workload's GPU is released (untimed: every run starts from an idle node)."""
    deadline = time.monotonic() + LIMIT_S
    while not _released(workload_id):
        if time.monotonic() > deadline:
            raise RuntimeError(f"workload {workload_id} kept its GPU")
        time.sleep(0.05)


def _job_id(name: str) -> int:
    from jobs.models import Workload

    return int(Workload.all_tenants.filter(name=name).values_list("pk", flat=True).get())


def gpc_wait(console: Console, name: str) -> float:
    """Return the seconds `gpc submit --wait` of a 1-second job takes (it must exit 0)."""
    argv = [str(GPC), "submit", "--image", IMAGE, "--pool", "bench", "--wait", name, "--", "sleep", "1"]
    seconds = _timed(lambda: _run(argv, console.env))
    _idle(_job_id(name))
    return seconds


def _curl(console: Console, *args: str) -> dict[str, Any]:
    headers = ["-H", f"Authorization: Bearer {console.token}", "-H", "Content-Type: application/json"]
    done = _run(["curl", "-sS", "--fail-with-body", *headers, *args])
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def curl_wait(console: Console, name: str) -> float:
    """Return the seconds from a curl submission of a 1-second job to a curl read that says it ended."""
    base = f"{console.url}/api/v1/tenants/bench/workloads/"
    body = json.dumps({"project": "bench", "name": name, "image": IMAGE, "pool": "bench", "command": ["sleep", "1"]})
    started = time.perf_counter()
    workload = _curl(console, "-H", f"Idempotency-Key: {uuid.uuid4()}", "-d", body, base)
    while _curl(console, f"{base}{workload['id']}/")["state"] not in ENDED:
        if time.perf_counter() - started > LIMIT_S:
            raise RuntimeError(f"{name} did not end within {LIMIT_S:g} s")
        time.sleep(POLL_SECONDS)
    seconds = time.perf_counter() - started
    _idle(int(workload["id"]))
    return seconds


def submit_wait(console: Console, runs: int) -> dict[str, list[float]]:
    """Return the seconds of every run of each way, alternated so that neither gets the warmer console."""
    results: dict[str, list[float]] = {"gpc": [], "curl": []}
    for run in range(runs):
        results["gpc"].append(gpc_wait(console, f"gpc-{run}"))
        results["curl"].append(curl_wait(console, f"curl-{run}"))
        print(
            f"submit --wait run {run}: gpc {results['gpc'][-1]:.2f} s, curl {results['curl'][-1]:.2f} s",
            file=sys.stderr,
        )
    return results


# --- (c) logs -f ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FollowResult:
    expected: int
    received: int
    lost: int
    duplicates: int
    in_order: bool
    stored: int
    cpu_seconds: float
    wall_seconds: float
    after_end_seconds: float


def _ascending(lines: list[str]) -> bool:
    """Return whether the lines are numbers, each above the one before."""
    numbers = [int(line) if line.isdigit() else -1 for line in lines]
    return all(0 <= before < after for before, after in itertools.pairwise(numbers))


def _stored(workload_id: int) -> int:
    from jobs.models import LogChunk

    spans = LogChunk.all_tenants.filter(workload_id=workload_id).values_list("first_seq", "last_seq")
    return sum(last - first + 1 for first, last in spans)


def _finished_at(workload_id: int) -> float:
    from jobs.models import Workload

    workload = Workload.all_tenants.get(pk=workload_id)
    if workload.state != "succeeded" or workload.finished_at is None:
        raise RuntimeError(f"the writer ended {workload.state}: {workload.reason_message}")
    return workload.finished_at.timestamp()


def follow(console: Console, rate: int, seconds: float, scratch: Path) -> FollowResult:
    """Run the writer job and follow it with `gpc logs -f` from its first line; return what arrived."""
    command = ["--", sys.executable, "-c", WRITER, str(rate), str(seconds)]
    submitted = _run(
        [str(GPC), "-o", "json", "submit", "--image", IMAGE, "--pool", "bench", "writer", *command], console.env
    )
    workload_id = int(json.loads(submitted.stdout)["id"])
    out = scratch / "followed.txt"
    started = time.perf_counter()
    with out.open("w") as sink:
        follower = subprocess.Popen([str(GPC), "logs", "-f", str(workload_id)], stdout=sink, env=console.env)
        _pid, status, usage = os.wait4(follower.pid, 0)  # its own rusage: the client's CPU, nobody else's
        follower.returncode = os.waitstatus_to_exitcode(status)
    ended = time.time()
    wall = time.perf_counter() - started
    if follower.returncode != 0:
        raise RuntimeError(f"gpc logs -f exited {follower.returncode}")
    received = out.read_text().splitlines()
    expected = [str(n) for n in range(1, int(rate * seconds) + 1)]
    distinct = set(received)
    return FollowResult(
        expected=len(expected),
        received=len(received),
        lost=len(set(expected) - distinct),
        duplicates=len(received) - len(distinct),
        in_order=_ascending(received),
        stored=_stored(workload_id),
        cpu_seconds=usage.ru_utime + usage.ru_stime,
        wall_seconds=wall,
        after_end_seconds=ended - _finished_at(workload_id),
    )


# --- report -----------------------------------------------------------------------------------


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)


def report(start: dict[str, float], whoami: float, waits: dict[str, list[float]], logs: FollowResult, rate: int) -> str:
    """Return the figures as a two-column table."""
    gpc, curl = statistics.median(waits["gpc"]), statistics.median(waits["curl"])
    rows = [
        ("gpc --help (median)", f"{start['gpc'] * 1000:.0f} ms (max {start['gpc_max'] * 1000:.0f} ms; target 150 ms)"),
        ("python -c pass (median)", f"{start['python'] * 1000:.0f} ms"),
        ("gpc whoami, one API call (median)", f"{whoami * 1000:.0f} ms"),
        (f"1 s job, gpc submit --wait (median of {len(waits['gpc'])})", f"{gpc:.2f} s"),
        (f"1 s job, curl submit + poll {POLL_SECONDS:g} s (median)", f"{curl:.2f} s"),
        ("gpc minus curl", f"{gpc - curl:+.2f} s"),
        (f"logs -f at {rate}/s: lines expected", f"{logs.expected}"),
        ("logs -f: lines stored by the console", f"{logs.stored}"),
        ("logs -f: lines received", f"{logs.received}"),
        ("logs -f: lines lost / duplicated", f"{logs.lost} / {logs.duplicates} (in order: {logs.in_order})"),
        ("logs -f: client CPU", f"{logs.cpu_seconds:.2f} s user+sys over {logs.wall_seconds:.1f} s"),
        ("logs -f: exited after the job ended", f"{logs.after_end_seconds:.2f} s"),
    ]
    return _table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--startup-runs", type=int, default=20)
    parser.add_argument("--wait-runs", type=int, default=5)
    parser.add_argument("--rate", type=int, default=10_000, help="lines a second the followed job writes")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long it writes")
    args = parser.parse_args()
    start = startup(args.startup_runs)
    with tempfile.TemporaryDirectory(prefix="gpucloud-bench-") as scratch:
        console = _console(Path(scratch))
        whoami = one_call(console, args.startup_runs)
        waits = submit_wait(console, args.wait_runs)
        logs = follow(console, args.rate, args.seconds, Path(scratch))
    print(report(start, whoami, waits, logs, args.rate))
    sys.stdout.flush()
    os._exit(0)  # the embedded workers and uvicorn threads need no orderly stop


if __name__ == "__main__":
    main()
