"""Latency of the pure scheduler core on the Alibaba 2023 cluster (openb), in-process.

    .venv/bin/python bench/scheduler_pass.py [--repeat 15]

Full pass: all 8,152 pods of openb_pod_list_default.csv pending at once on all
1,213 GPU nodes (6,212 GPUs), 10 tenants (pods hashed to tenants by CRC-32 of
their name) with guarantees proportional to their requested GPU-hours and the
whole cluster as limit; a fractional-GPU pod counts as one GPU, CPU-only pods
are placed by CPU and memory. Incremental pass: the cluster loaded with what
the full pass placed (running for an hour), then 100 new arrivals (copies of
the last 100 pods), alone and together with the backlog the full pass left.
Only the core's pass is timed, run as the shell runs it (`jobs.scheduler.frozen.schedule`:
the collector kept off the snapshot); building the snapshot is the shell's job.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.scheduler.core import Decisions, Node, Pool, Snapshot, Workload  # noqa: E402
from jobs.scheduler.frozen import schedule  # noqa: E402
from jobs.scheduler.simulator import build, traces  # noqa: E402

TRACE = ROOT.parent / "shared" / "data" / "traces" / "alibaba-gpu-v2023"


def timed(snapshot: Snapshot, repeat: int) -> tuple[dict[str, float], Decisions]:
    """Return median and p95 seconds of `repeat` passes (after one warm-up), and the decisions."""
    decisions = schedule(snapshot)
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        schedule(snapshot)
        samples.append(time.perf_counter() - started)
    samples.sort()
    p95 = samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]
    return {"median_s": round(statistics.median(samples), 4), "p95_s": round(p95, 4), "runs": repeat}, decisions


def loaded(full: Snapshot, decisions: Decisions, now: float) -> tuple[Snapshot, list[Workload]]:
    """Return the snapshot after the full pass's placements started at `full.now`, and the backlog."""
    placed = [
        replace(w, started_at=full.now, allocation=decisions.placements[w.id])
        for w in full.pending
        if w.id in decisions.placements
    ]
    used_cpu: dict[str, int] = defaultdict(int)
    used_memory: dict[str, int] = defaultdict(int)
    for w in placed:
        for replica in w.allocation:
            used_cpu[replica.node] += w.cpu_milli
            used_memory[replica.node] += w.memory_mib
    nodes: list[Node] = [
        replace(
            n,
            cpu_free_milli=n.cpu_free_milli - used_cpu[n.name],
            memory_free_mib=n.memory_free_mib - used_memory[n.name],
        )
        for n in full.nodes
    ]
    backlog = [w for w in full.pending if w.id not in decisions.placements]
    return replace(full, now=now, nodes=tuple(nodes), running=tuple(placed), pending=()), backlog


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    nodes = traces.alibaba_nodes(TRACE)
    pods = traces.alibaba_pods(TRACE / "openb_pod_list_default.csv")
    capacity = sum(n.gpus for n in nodes)
    tenant_quotas, project_quotas = build.default_quotas(build.gpu_hour_shares(pods), capacity)
    full = Snapshot(
        now=0.0,
        pools=(Pool(build.POOL),),
        nodes=build.core_nodes(nodes),
        tenant_quotas=tenant_quotas,
        project_quotas=project_quotas,
        pending=tuple(build.pending_workload(p) for p in pods),
    )
    full_timing, decisions = timed(full, args.repeat)
    base, backlog = loaded(full, decisions, now=3600.0)
    arrivals = [replace(w, id=f"{w.id}-again", submitted_at=3600.0) for w in full.pending[-100:]]
    only_new, new_decisions = timed(replace(base, pending=tuple(arrivals)), args.repeat)
    with_backlog, _ = timed(replace(base, pending=tuple(backlog + arrivals)), args.repeat)
    print(
        json.dumps(
            {
                "trace": "alibaba-gpu-v2023 openb_pod_list_default.csv, pods hashed (CRC-32 of name) to 10 tenants",
                "nodes": len(nodes),
                "gpus": capacity,
                "full_pass": {
                    "pending": len(full.pending),
                    "placed": len(decisions.placements),
                    "gpus_placed": sum(w.total_gpus for w in full.pending if w.id in decisions.placements),
                    **full_timing,
                },
                "incremental_pass_100_arrivals": {
                    "running": len(base.running),
                    "placed": len(new_decisions.placements),
                    **only_new,
                },
                "incremental_pass_100_arrivals_plus_backlog": {
                    "running": len(base.running),
                    "pending": len(backlog) + len(arrivals),
                    **with_backlog,
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
