"""Scheduling quality: every policy side by side on the Philly-derived trace, under two preemption cost models.

    .venv/bin/python bench/scheduler_quality.py [--gpus 512] [--limit-jobs N] [--seed 0] [--max-runtime S]
        [--restart-overhead 60] [--workers 2] [--no-eta] [--skip-simulation] [--pods FILE] [--json FILE]

Simulation: the Philly-derived trace (15 teams as tenants, 15,264 jobs, ~125
days) on `--gpus` GPUs of 8-GPU V100 nodes, guarantees proportional to each
team's submitted GPU-hours, replayed under each policy (`fifo`, `backfill`,
`slurm`, `fairshare`) and two cost models of preemption: `no_checkpoints`
(no job checkpoints: a preempted job redoes everything) and `mix` (the
default: 40 % of jobs checkpoint every 15, 30 or 60 minutes). Only
`fairshare` preempts, so the cost model changes only its runs: each
baseline runs once (under `mix`, where start estimates are measured) and
stands in both tables. A job longer than the pool's maximum runs as a chain
of jobs of at most the maximum (docs/simulator.md). Also printed: the
lower bound of mean completion time (every job starting at its submission:
its run time alone), which says how far any policy could beat another. What a policy may know
of a job's length is its time limit (drawn as users submit them: 17 % ask
for the pool's maximum, `--max-runtime`, 7 days by default, the rest run
time x 1.5-10, seeded by `--seed`) and a run time predicted from similar
completed jobs; a job still running at its limit is killed
(docs/simulator.md). Printed per cost model: completion times, waits
(overall and by the job's total GPUs: 1, 2-8, more than 8; mean and max),
fairness, preemption cost, kills, prediction and start-estimate error, and
each baseline over fairshare. Start estimates are asked of the core, and
measured, in the `mix` runs only (`--no-eta`: in none); they cost time.

The eight runs go to `--workers` processes (default 2); each takes one to
two minutes on one core here. The checkpoint-aware against plain victim
comparison, and the lossless model, were dropped from this benchmark to keep
it to the policies; `gpucloud simulate --plain-victims` and
`--lossless-preemption` still run them.

Packing (kept: about 5 s of CPU; `--skip-simulation` runs only this): the
pods of openb_pod_list_multigpu50.csv (or `--pods FILE`) placed in order on
all 1,213 Alibaba GPU nodes until the first pod that no longer fits (a
fractional pod takes one whole GPU, CPU and memory count), with the core's
bin-packing (`binpack`), plain best fit by free GPU count (`best_fit_gpus`)
and first fit (`first_fit`): the share of GPUs left unallocated then, and
how many 8-GPU pods were placed out of those attempted before the stop; also
every pod in order, skipping those that do not fit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.scheduler.core import Ordering, PlacementPolicy  # noqa: E402
from jobs.scheduler.core.capacity import NO_NODES, PoolCapacity  # noqa: E402
from jobs.scheduler.simulator import build, traces  # noqa: E402
from jobs.scheduler.simulator.engine import Settings, Simulation  # noqa: E402
from jobs.scheduler.simulator.users import DEFAULT_MAX_RUNTIME_S, LimitModel  # noqa: E402

TRACES = ROOT.parent / "shared" / "data" / "traces"
POLICIES = (Ordering.FIFO, Ordering.BACKFILL, Ordering.SLURM, Ordering.FAIRSHARE)
# Cost models: what `Settings.checkpoint_interval_s` is (0.0: no job checkpoints; None: each job's draw).
COSTS: dict[str, float | None] = {"no_checkpoints": 0.0, "mix": None}


def run_one(policy: str, cost: str, options: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """Return (cost model, policy, summary) of one run on the Philly-derived trace (in a worker process)."""
    trace = traces.load_philly(TRACES / "philly-derived", options["gpus"], options["limit_jobs"])
    capacity = sum(node.gpus for node in trace.nodes)
    tenant_quotas, project_quotas = build.default_quotas(build.gpu_hour_shares(trace.jobs), capacity)
    settings = Settings(
        Ordering(policy),
        tenant_quotas,
        project_quotas,
        checkpoint_interval_s=COSTS[cost],
        restart_overhead_s=options["restart_overhead"],
        seed=options["seed"],
        limits=LimitModel(max_runtime_s=options["max_runtime"]),
        estimates=options["eta"] and cost == "mix",
    )
    started = time.perf_counter()
    summary = Simulation(trace, settings).run().summary
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    return cost, policy, summary


def simulation(args: argparse.Namespace) -> dict[str, Any]:
    """Return every run's summary by cost model and policy, and each baseline's ratios over fairshare."""
    options = {
        "gpus": args.gpus,
        "limit_jobs": args.limit_jobs,
        "restart_overhead": args.restart_overhead,
        "seed": args.seed,
        "max_runtime": args.max_runtime,
        "eta": not args.no_eta,
    }
    # Slowest first (fairshare preempts and reserves, slurm sorts by priority), so the workers finish together.
    order = [(p, c) for p in reversed(POLICIES) for c in COSTS if p is Ordering.FAIRSHARE or c == "mix"]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = [pool.submit(run_one, p.value, c, options) for p, c in order]
        results = [future.result() for future in futures]
    out: dict[str, Any] = {cost: {} for cost in COSTS}
    for cost, policy, summary in results:
        out[cost][policy] = summary
        if policy != Ordering.FAIRSHARE.value:
            out["no_checkpoints"][policy] = summary  # it never preempts: the cost model changes nothing
    for cost in COSTS:
        out[cost]["over_fairshare"] = {
            p.value: _ratios(out[cost][p.value], out[cost]["fairshare"])
            for p in POLICIES
            if p is not Ordering.FAIRSHARE
        }
    trace = traces.load_philly(TRACES / "philly-derived", args.gpus, args.limit_jobs)
    bound = sum(job.duration_s for job in trace.jobs) / max(1, len(trace.jobs))
    return {"trace": "philly-derived", "gpus": args.gpus, **options, "mean_jct_lower_bound_s": bound, **out}


def _ratios(top: dict[str, Any], bottom: dict[str, Any]) -> dict[str, float | None]:
    keys = ("mean_jct_s", "p95_jct_s", "mean_wait_s")
    return {key: round(top[key] / bottom[key], 2) if bottom[key] else None for key in keys}


class _FirstFit(PoolCapacity):
    """The baseline: the first node by name with room, whatever is left on it."""

    def find(
        self, models: tuple[str, ...], gpus: int, cpu: int, memory: int, excluded: frozenset[int] = NO_NODES
    ) -> tuple[int, str] | None:
        for node in self.nodes:
            if node.cpu < cpu or node.memory < memory:
                continue
            for model in models if gpus else ("",):
                if not gpus or len(node.free.get(model, ())) >= gpus:
                    return (node.number, model)
        return None


class _GpuCountBestFit(PoolCapacity):
    """Best fit by GPU count alone: the node with the fewest free GPUs of a model that still fit, first by name."""

    def find(
        self, models: tuple[str, ...], gpus: int, cpu: int, memory: int, excluded: frozenset[int] = NO_NODES
    ) -> tuple[int, str] | None:
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


def _size(size: str, stat: str) -> Any:
    return lambda summary: summary["wait_by_size"][size][stat]


def _key(key: str) -> Any:
    return lambda summary: summary[key]


# (label, how to read it from a summary, format) of the simulation table's rows.
_ROWS: tuple[tuple[str, Any, str], ...] = (
    ("mean completion time (s)", _key("mean_jct_s"), "{:,.0f}"),
    ("p95 completion time (s)", _key("p95_jct_s"), "{:,.0f}"),
    ("mean wait (s)", _key("mean_wait_s"), "{:,.0f}"),
    ("p95 wait (s)", _key("p95_wait_s"), "{:,.0f}"),
    ("wait, 1 GPU: mean (s)", _size("1", "mean_s"), "{:,.0f}"),
    ("wait, 1 GPU: max (s)", _size("1", "max_s"), "{:,.0f}"),
    ("wait, 2-8 GPUs: mean (s)", _size("2-8", "mean_s"), "{:,.0f}"),
    ("wait, 2-8 GPUs: max (s)", _size("2-8", "max_s"), "{:,.0f}"),
    ("wait, >8 GPUs: mean (s)", _size(">8", "mean_s"), "{:,.0f}"),
    ("wait, >8 GPUs: max (s)", _size(">8", "max_s"), "{:,.0f}"),
    ("Jain's index", _key("jain_index"), "{:.3f}"),
    ("mean GPU allocation", _key("gpu_allocation_mean"), "{:.2f}"),
    ("preemptions (most of one job)", lambda s: f"{s['preemptions']:,} ({s['max_preemptions_one_job']})", "{}"),
    ("GPU-h lost to preemption", _key("preemption_lost_gpu_hours"), "{:,.1f}"),
    ("killed at limit", _key("killed_at_limit"), "{:,}"),
    ("ETA error p50 / p90", lambda s: _pair(s["eta_error_p50"], s["eta_error_p90"]), "{}"),
    ("ETA miss p50 / p90 (h)", lambda s: _hours(s["eta_miss_p50_s"], s["eta_miss_p90_s"]), "{}"),
    ("prediction error p50 (share)", lambda s: _pair(s["prediction_error_p50"], s["predicted_share"]), "{}"),
    ("quota violations", _key("quota_violations"), "{:,}"),
    ("finished / unfinished", lambda s: f"{s['finished']:,} / {s['unfinished']:,}", "{}"),
    ("wall time (s)", _key("wall_s"), "{:,.0f}"),
)


def _pair(first: float | None, second: float | None) -> str:
    if first is None:
        return "-"
    return f"{first:.2f} / {second:.2f}" if second is not None else f"{first:.2f}"


def _hours(first: float | None, second: float | None) -> str:
    return "-" if first is None or second is None else f"{first / 3600:.1f} / {second / 3600:.1f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * w for w in widths], *rows]
    cells = [
        [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        for line in lines
    ]
    return "\n".join("  ".join(line).rstrip() for line in cells)


def simulation_table(report: dict[str, Any], cost: str) -> str:
    """Return one cost model's runs side by side, and each baseline's mean JCT and wait over fairshare."""
    runs = report[cost]
    names = [p.value for p in POLICIES]
    rows = [[label, *(form.format(read(runs[n])) for n in names)] for label, read, form in _ROWS]
    for key, label in (("mean_jct_s", "mean JCT"), ("mean_wait_s", "mean wait")):
        ratios = [runs["over_fairshare"].get(n, {}).get(key) for n in names]
        rows.append([f"{label} over fairshare", *(f"{r:.2f}x" if r is not None else "" for r in ratios)])
    bound = report["mean_jct_lower_bound_s"]
    rows.append(["mean JCT over its lower bound", *(f"{runs[n]['mean_jct_s'] / bound:.2f}x" for n in names)])
    first = runs["fairshare"]
    words = "no job checkpoints" if cost == "no_checkpoints" else "40 % of jobs checkpoint every 15/30/60 min"
    title = (
        f"Philly-derived, {first['jobs']:,} jobs ({first['submitted_gpu_hours']:,.0f} GPU-h), {report['gpus']} GPUs, "
        f"seed {report['seed']}, max runtime {report['max_runtime'] / 86_400:g} d; {words}, "
        f"{report['restart_overhead']:g} s to restart"
    )
    return title + "\n\n" + _table(["", *names], rows)


def packing_table(report: dict[str, Any]) -> str:
    """Return the packing results, one row per policy and stopping rule."""
    rows = []
    for policy in ("binpack", "best_fit_gpus", "first_fit"):
        for rule in ("until_first_failure", "all_pods_skipping_failures"):
            r = report[policy][rule]
            rows.append(
                [
                    f"{policy}, {rule.replace('_', ' ')}",
                    f"{r['unallocated_gpu_share']:.2%}",
                    f"{r['pods_placed']:,}",
                    f"{r['eight_gpu_pods_placed']} of {r['eight_gpu_pods_attempted']}",
                ]
            )
    header = ["", "GPUs unallocated", "pods placed", "8-GPU pods placed"]
    return f"Packing: {report['trace']}\n\n" + _table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--limit-jobs", type=int, help="replay only the first N jobs (by arrival)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the per-job draws (limits, checkpoints)")
    parser.add_argument("--max-runtime", type=float, default=DEFAULT_MAX_RUNTIME_S, metavar="SECONDS")
    parser.add_argument("--restart-overhead", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--workers", type=int, default=2, help="simulations run in this many processes")
    parser.add_argument("--no-eta", action="store_true", help="do not ask for (nor measure) start estimates")
    parser.add_argument("--skip-simulation", action="store_true", help="run the packing comparison only")
    parser.add_argument("--pods", default="openb_pod_list_multigpu50.csv", help="pod list of the packing test")
    parser.add_argument("--json", type=Path, help="also write the full report (every summary) here")
    args = parser.parse_args()
    report: dict[str, Any] = {"packing": packing(args.pods)}
    print(packing_table(report["packing"]), end="\n\n", flush=True)
    if not args.skip_simulation:
        report["simulation"] = simulation(args)
        print("\n\n".join(simulation_table(report["simulation"], cost) for cost in COSTS))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
