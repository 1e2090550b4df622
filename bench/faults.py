"""Fault suite: real processes killed and restarted under real work; what the ledger says against what happened.

    .venv/bin/python bench/faults.py [--fault NAME ...] [--code DIR] [--out FILE] [--starve-minutes 15]

Each fault runs on a fresh console of the code tree `--code` (default: this
checkout), started as it is deployed, with real short batch jobs and
JupyterLab notebooks on the process runtime, submitted through the REST API
with an API token. One fault at a time; the table goes to stderr, the JSON
(a list, one object per fault) to stdout and to `--out` (rewritten after
each fault, so a long run keeps what it measured).

Faults (`--list` prints them):

    embedded-starve   `gpucloud up` beside two busy processes for --starve-minutes (default 15):
                      --starve-jobs (50) jobs and --starve-notebooks (5) notebooks, the issue's run
    embedded-kill     kill -9 `gpucloud up` mid-run, start it again
    web-kill          kill -9 `gpucloud serve`          (distributed: Postgres + Redis,
    worker-kill       kill -9 `gpucloud worker`          web, worker, beat and two agents
    beat-kill         kill -9 beat                       of 4 simulated GPUs each)
    agent-kill        kill -9 the agent running the most replicas
    redis-restart     kill -9 Redis (a private redis-server on 6390, no persistence)
    postgres-restart  immediate stop of Postgres (a private cluster on 5440 in /tmp/faults-pg)
    docker-restart    kill -9 of a private Docker Engine (/tmp/faults-docker-PID, live restore) running the jobs
                      in containers of the test image, CPU only; skipped where there is no dockerd

Kill faults hit the component while notebooks serve, jobs stream their
logs, a burst of submissions is being placed and launched, and the client
keeps submitting; it stays down --down seconds (5). Figures per fault
(`bench/_faults/report.py` defines them): workloads lost, falsely failed,
orphans left after reconcile, double allocations, log lines lost, seconds
to converge after the fault ends, seconds from the restart until every
workload not ended at the fault runs again (or truly ended), and the most
queued control tasks (Redis `LLEN control` every 0.5 s; embedded: the
in-process transport's queue plus what its workers took and have not
started, sampled by `bench/_faults/launch.py`). Targets: 0, 0, 0, 0, 0 and
at most 30 s.

Services: distributed faults use scratch databases `gpucloud_faults_*` on
the Postgres of --database (default the shared one on 127.0.0.1:5432, role
gpucloud with CREATEDB) and Redis database 3 of --redis (default
redis://127.0.0.1:6379/3, flushed at each run); the shared servers are never
restarted. Postgres 15 binaries and redis-server are needed for the restart
faults (run as root: the private Postgres runs as user postgres), dockerd
for the Docker one.

Before and after a change, on this machine (2 cores):

    # after: this checkout
    .venv/bin/python bench/faults.py --out /work/faults-after/all.json
    # before: a worktree of the older commit, run by the same harness and interpreter
    git worktree add /work/before 676f05e
    .venv/bin/python bench/faults.py --code /work/before --out /work/faults-before/all.json
    # one fault, or the issue's 15-minute CPU-starved embedded run alone
    .venv/bin/python bench/faults.py --fault agent-kill
    .venv/bin/python bench/faults.py --fault embedded-starve --starve-minutes 15 --out /work/faults-after/starve.json

Every component prints the code tree it imported (`faults: gpucloud from
...`) at the top of its log; a tree without browser assets gets them built
first (node_modules linked from this checkout). `--keep` keeps the run
directories under /tmp/faults-runs (logs, data, proof files) and the
scratch databases. Distributed runs flush Redis database 3 and reuse the
database names: never run two at once (nor beside tests/faults/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from _faults.catalog import FAULTS, Settings
from _faults.report import table
from _faults.scenarios import run_fault
from _faults.services import PG_BIN, SHARED_DATABASE, SHARED_REDIS, wait_for_shared

ROOT = Path(__file__).resolve().parents[1]


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", action="append", choices=sorted(FAULTS), help="run this fault (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the faults and exit")
    parser.add_argument("--code", type=Path, default=ROOT, help="the code tree to measure (default: this checkout)")
    parser.add_argument("--out", type=Path, help="also write the JSON here (after each fault)")
    parser.add_argument("--starve-minutes", type=float, default=15.0)
    parser.add_argument("--starve-jobs", type=int, default=50)
    parser.add_argument("--starve-notebooks", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=12, help="batch jobs of each kill or restart fault")
    parser.add_argument("--notebooks", type=int, default=2, help="notebooks of each kill or restart fault")
    parser.add_argument("--nodes", type=int, default=2, help="agents of a distributed fault (4 GPUs each)")
    parser.add_argument("--down", type=float, default=5.0, help="seconds a killed component stays down")
    parser.add_argument("--observe-min", type=float, default=60.0, help="seconds observed after the fault at least")
    parser.add_argument("--observe-max", type=float, default=300.0, help="... and at most")
    parser.add_argument("--database", default=SHARED_DATABASE, help="Postgres server for the scratch databases")
    parser.add_argument("--redis", default=SHARED_REDIS, help="Redis database of the suite's own (flushed)")
    parser.add_argument("--worker-queues", help="--queues of the controller's worker (default: the CLI's)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra component setting")
    parser.add_argument("--wait-services", type=float, default=900.0, help="seconds to wait for Postgres and Redis")
    parser.add_argument("--keep", action="store_true", help="keep run directories and scratch databases")
    return parser.parse_args()


def _assets(code: Path) -> None:
    """Build the code tree's browser assets when it has none (a fresh worktree): its pages need them."""
    if (code / "frontend" / "static" / "vendor").is_dir():
        return
    modules = code / "node_modules"
    if not modules.exists() and (ROOT / "node_modules").is_dir():
        modules.symlink_to(ROOT / "node_modules")
    subprocess.run(["node", "frontend/build_assets.mjs"], cwd=code, check=True)


def _unavailable(name: str) -> str | None:
    """Return why fault `name` cannot run on this machine, or None."""
    private = FAULTS[name].private
    if private == "docker" and (shutil.which("dockerd") is None or os.geteuid() != 0):
        return "needs dockerd and root (a private Docker Engine)"
    if private == "postgres" and not (PG_BIN / "pg_ctl").exists():
        return f"needs Postgres 15 binaries in {PG_BIN}"
    if private == "redis" and shutil.which("redis-server") is None:
        return "needs redis-server"
    return None


def main() -> None:
    args = _arguments()
    if args.list:
        for fault in FAULTS.values():
            print(f"{fault.name:18} {fault.mode:12} {fault.about}")
        return
    names = args.fault or list(FAULTS)
    settings = Settings(
        code=args.code.resolve(),
        starve_minutes=args.starve_minutes,
        starve_jobs=args.starve_jobs,
        starve_notebooks=args.starve_notebooks,
        jobs=args.jobs,
        notebooks=args.notebooks,
        down=args.down,
        distributed_nodes=args.nodes,
        observe_min=args.observe_min,
        observe_max=args.observe_max,
        database_server=args.database,
        redis_url=args.redis,
        worker_queues=args.worker_queues,
        extra_env=dict(item.split("=", 1) for item in args.env),
        keep=args.keep,
    )
    _assets(settings.code)
    if any(FAULTS[name].mode == "distributed" for name in names):
        wait_for_shared(args.database, args.redis, args.wait_services)
    results: list[dict[str, Any]] = []
    for name in names:
        reason = _unavailable(name)
        results.append({"fault": name, "skipped": reason} if reason else run_fault(name, settings))
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(table(results[-1:]), file=sys.stderr, flush=True)
    print(json.dumps(results, indent=2, default=str))
    print("\n" + table(results), file=sys.stderr)


if __name__ == "__main__":
    main()
