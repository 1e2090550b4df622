"""Scheduling quality: fair share against FIFO on the Philly-derived trace, and packing on the Alibaba cluster.

    .venv/bin/python bench/scheduler_quality.py [--gpus 512] [--limit-jobs N] [--skip-simulation]

Simulation: the Philly-derived trace (15 teams as tenants, 15,264 jobs, ~125
days) on `--gpus` GPUs of 8-GPU V100 nodes, guarantees proportional to each
team's submitted GPU-hours, under `fairshare` (the core) and `fifo` (strict
FIFO in the same engine); both summaries and the ratios the issue targets.

Packing: the pods of openb_pod_list_multigpu50.csv (or `--pods FILE`) placed
in order on all 1,213 Alibaba GPU nodes until the first pod that no longer
fits (a fractional pod takes one whole GPU, CPU and memory count), with the
core's bin-packing (`binpack`: fewest GPUs stranded without CPU or memory,
then best fit), with plain best fit by free GPU count (`best_fit_gpus`, the
core's policy before) and with a first-fit baseline (`first_fit`, first node
by name with room): the share of GPUs left unallocated then, and how many
8-GPU pods were placed out of those attempted before the stop. Also, every
pod in order, skipping those that do not fit (most 8-GPU pods come late in
the list).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.scheduler.core import Ordering, PlacementPolicy  # noqa: E402
from jobs.scheduler.core.capacity import PoolCapacity  # noqa: E402
from jobs.scheduler.simulator import build, traces  # noqa: E402
from jobs.scheduler.simulator.engine import Settings, simulate  # noqa: E402

TRACES = ROOT.parent / "shared" / "data" / "traces"


def simulation(gpus: int, limit_jobs: int | None) -> dict[str, Any]:
    """Return both policies' summaries on the Philly-derived trace and fifo/fairshare ratios."""
    trace = traces.load_philly(TRACES / "philly-derived", gpus, limit_jobs)
    capacity = sum(node.gpus for node in trace.nodes)
    tenant_quotas, project_quotas = build.default_quotas(build.gpu_hour_shares(trace.jobs), capacity)
    out: dict[str, Any] = {}
    for ordering in (Ordering.FAIRSHARE, Ordering.FIFO):
        started = time.perf_counter()
        summary = simulate(trace, Settings(ordering, tenant_quotas, project_quotas)).summary
        summary["wall_s"] = round(time.perf_counter() - started, 1)
        out[ordering.value] = summary
    fair, fifo = out["fairshare"], out["fifo"]
    out["fifo_over_fairshare"] = {
        key: round(fifo[key] / fair[key], 2) if fair[key] else None
        for key in ("mean_jct_s", "mean_wait_s", "p95_jct_s")
    }
    return out


class _FirstFit(PoolCapacity):
    """The baseline: the first node by name with room, whatever is left on it."""

    def find(self, models: tuple[str, ...], gpus: int, cpu: int, memory: int) -> tuple[int, str] | None:
        for node in self.nodes:
            if node.cpu < cpu or node.memory < memory:
                continue
            for model in models if gpus else ("",):
                if not gpus or len(node.free.get(model, ())) >= gpus:
                    return (node.number, model)
        return None


class _GpuCountBestFit(PoolCapacity):
    """Best fit by GPU count alone: the node with the fewest free GPUs of a model that still fit, first by name."""

    def find(self, models: tuple[str, ...], gpus: int, cpu: int, memory: int) -> tuple[int, str] | None:
        buckets = [(self.by_model[m].buckets, m) for m in models] if gpus else [(self.by_total.buckets, "")]
        for count in range(gpus, max((len(b) for b, _ in buckets), default=0)):
            found = [
                (number, model)
                for bucket, model in buckets
                if count < len(bucket)
                for number in bucket[count]
                if self.nodes[number].cpu >= cpu and self.nodes[number].memory >= memory
            ]
            if found:
                return min(found)
        return None


def _fill(capacity: PoolCapacity, pods: list[traces.TraceJob], stop: bool) -> dict[str, Any]:
    """Place pods in order (stopping at, or skipping, those that do not fit); return what is left and 8-GPU success."""
    total = sum(capacity.capacity_by_model.values())
    placed = eight_tried = eight_placed = 0
    for pod in pods:
        eight_tried += pod.gpus == 8
        takes = capacity.place_gang(
            capacity.accepted(pod.models), pod.gpus, pod.replicas, pod.cpu_milli, pod.memory_mib
        )
        if takes is None and stop:
            break
        placed += takes is not None
        eight_placed += takes is not None and pod.gpus == 8
    return {
        "pods_placed": placed,
        "unallocated_gpu_share": round(capacity.free_gpus(capacity.models) / total, 4),
        "eight_gpu_pods_placed": eight_placed,
        "eight_gpu_pods_attempted": eight_tried,
    }


def packing(pod_list: str) -> dict[str, Any]:
    """Return unallocated GPU share and 8-GPU placement success at the first pod that does not fit, per policy."""
    directory = TRACES / "alibaba-gpu-v2023"
    nodes = build.core_nodes(traces.alibaba_nodes(directory))
    pods = traces.alibaba_pods(directory / pod_list)
    results = {}
    policies: tuple[tuple[str, type[PoolCapacity]], ...] = (
        ("binpack", PoolCapacity),
        ("best_fit_gpus", _GpuCountBestFit),
        ("first_fit", _FirstFit),
    )
    for name, kind in policies:
        results[name] = {
            "until_first_failure": _fill(kind(build.POOL, PlacementPolicy.BINPACK, nodes, set()), pods, stop=True),
            "all_pods_skipping_failures": _fill(
                kind(build.POOL, PlacementPolicy.BINPACK, nodes, set()), pods, stop=False
            ),
        }
    return {"trace": f"alibaba-gpu-v2023 {pod_list} on all 1,213 GPU nodes", **results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--limit-jobs", type=int)
    parser.add_argument("--skip-simulation", action="store_true")
    parser.add_argument("--pods", default="openb_pod_list_multigpu50.csv", help="pod list of the packing test")
    args = parser.parse_args()
    report: dict[str, Any] = {"packing": packing(args.pods)}
    if not args.skip_simulation:
        report["simulation"] = {"trace": "philly-derived", "gpus": args.gpus, **simulation(args.gpus, args.limit_jobs)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
