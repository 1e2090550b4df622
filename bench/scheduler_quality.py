"""Scheduling quality: fair share against FIFO on the Philly-derived trace, what preemption costs, and packing.

    .venv/bin/python bench/scheduler_quality.py [--gpus 512] [--limit-jobs N] [--checkpoint-interval 1800]
        [--restart-overhead 60] [--lossless] [--workers 2] [--skip-simulation] [--pods FILE] [--json FILE]

Simulation: the Philly-derived trace (15 teams as tenants, 15,264 jobs, ~125
days) on `--gpus` GPUs of 8-GPU V100 nodes, guarantees proportional to each
team's submitted GPU-hours. Preemption costs what it costs: a preempted job
redoes its work since its last checkpoint (every `--checkpoint-interval`
seconds of run time, 1,800 by default; the trace says nothing, so every job
gets the same interval) and pays `--restart-overhead` seconds (60) of run time
when it starts again. Runs: `fifo` (strict FIFO in the same engine, which never
preempts, so it pays nothing), `fairshare` (the core, checkpoint-aware victim
choice) and `fairshare_plain_victims` (the core with
`SchedulerConfig.checkpoint_aware` off: victims newest first, checkpoints
ignored). Printed: fair share against FIFO with the cost included, and the
GPU-hours lost to preemption under both victim choices. `--lossless` adds
`fairshare_lossless`, the model before (a preempted job keeps all its
progress at no cost; docs/scheduler.md gives its figures too). The runs
go to `--workers` processes (default 2): the default run takes 3 to 4.5
minutes on 2 cores, `--lossless` about 2 more. Also printed: at every pass
where the checkpoint-aware run preempted, what the plain choice would have
lost on the same state (the two runs drift apart, so their totals also
measure where each happened to go).

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
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.scheduler.core import Decisions, Ordering, PlacementPolicy, Snapshot  # noqa: E402
from jobs.scheduler.core.capacity import NO_NODES, PoolCapacity  # noqa: E402
from jobs.scheduler.frozen import schedule  # noqa: E402
from jobs.scheduler.simulator import build, traces  # noqa: E402
from jobs.scheduler.simulator.engine import Settings, Simulation  # noqa: E402

TRACES = ROOT.parent / "shared" / "data" / "traces"

# Each run: its ordering and what differs in its settings. Slowest first, so that two workers finish together.
RUNS: dict[str, tuple[Ordering, dict[str, Any]]] = {
    "fairshare": (Ordering.FAIRSHARE, {}),
    "fairshare_plain_victims": (Ordering.FAIRSHARE, {"checkpoint_aware": False}),
    "fairshare_lossless": (Ordering.FAIRSHARE, {"lossless_preemption": True}),
    "fifo": (Ordering.FIFO, {}),
}


class _ShadowedSimulation(Simulation):
    """A run that, at every pass where it preempts, also asks what the plain victim choice would lose there.

    Two runs drift apart after their first different preemption (other jobs
    wait, other owners borrow), so their totals also measure where each run
    happened to go; this compares the two choices on the very same states.
    """

    def __init__(self, trace: traces.Trace, settings: Settings) -> None:
        super().__init__(trace, settings)
        self.same_states = {
            "passes": 0,
            "preemptions": 0,
            "lost_gpu_s": 0.0,
            "plain_preemptions": 0,
            "plain_lost_gpu_s": 0.0,
        }

    def decide(self, snapshot: Snapshot) -> Decisions:
        decisions = super().decide(snapshot)
        if decisions.preemptions:
            plain = schedule(replace(snapshot, config=replace(snapshot.config, checkpoint_aware=False)))
            self.same_states["passes"] += 1
            self.same_states["preemptions"] += len(decisions.preemptions)
            self.same_states["lost_gpu_s"] += sum(p.lost_gpu_seconds for p in decisions.preemptions)
            self.same_states["plain_lost_gpu_s"] += sum(p.lost_gpu_seconds for p in plain.preemptions)
            self.same_states["plain_preemptions"] += len(plain.preemptions)
        return decisions


def run_one(name: str, gpus: int, limit_jobs: int | None, costs: dict[str, float]) -> tuple[str, dict[str, Any]]:
    """Return (name, summary) of one run of `RUNS` on the Philly-derived trace (in a worker process)."""
    trace = traces.load_philly(TRACES / "philly-derived", gpus, limit_jobs)
    capacity = sum(node.gpus for node in trace.nodes)
    tenant_quotas, project_quotas = build.default_quotas(build.gpu_hour_shares(trace.jobs), capacity)
    ordering, overrides = RUNS[name]
    settings = Settings(ordering, tenant_quotas, project_quotas, **{**costs, **overrides})
    started = time.perf_counter()
    simulation = _ShadowedSimulation(trace, settings) if name == "fairshare" else Simulation(trace, settings)
    summary = simulation.run().summary
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    if isinstance(simulation, _ShadowedSimulation):
        shadow = simulation.same_states
        summary["same_states"] = {
            "passes_preempting": shadow["passes"],
            "preemptions": shadow["preemptions"],
            "lost_progress_gpu_hours": round(shadow["lost_gpu_s"] / 3600, 1),
            "plain_preemptions": shadow["plain_preemptions"],
            "plain_lost_progress_gpu_hours": round(shadow["plain_lost_gpu_s"] / 3600, 1),
        }
    return name, summary


def simulation(args: argparse.Namespace) -> dict[str, Any]:
    """Return every run's summary on the Philly-derived trace, and the ratios the issue targets."""
    names = [name for name in RUNS if args.lossless or name != "fairshare_lossless"]
    costs = {"checkpoint_interval_s": args.checkpoint_interval, "restart_overhead_s": args.restart_overhead}
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = [pool.submit(run_one, name, args.gpus, args.limit_jobs, costs) for name in names]
        out: dict[str, Any] = dict(future.result() for future in futures)
    out["fifo_over_fairshare"] = _ratios(out["fifo"], out["fairshare"], ("mean_jct_s", "mean_wait_s", "p95_jct_s"))
    out["plain_over_checkpoint_aware"] = _ratios(
        out["fairshare_plain_victims"], out["fairshare"], ("preemption_lost_gpu_hours", "lost_progress_gpu_hours")
    )
    return {"trace": "philly-derived", "gpus": args.gpus, **costs, **out}


def _ratios(top: dict[str, Any], bottom: dict[str, Any], keys: tuple[str, ...]) -> dict[str, float | None]:
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


# (label, summary key, format) of the simulation table's rows.
_ROWS = (
    ("mean completion time (s)", "mean_jct_s", "{:,.0f}"),
    ("p50 completion time (s)", "p50_jct_s", "{:,.0f}"),
    ("p95 completion time (s)", "p95_jct_s", "{:,.0f}"),
    ("mean queueing delay (s)", "mean_wait_s", "{:,.0f}"),
    ("p95 queueing delay (s)", "p95_wait_s", "{:,.0f}"),
    ("Jain's index", "jain_index", "{:.3f}"),
    ("mean GPU allocation", "gpu_allocation_mean", "{:.2f}"),
    ("preemptions", "preemptions", "{:,}"),
    ("GPU-h lost: progress redone", "lost_progress_gpu_hours", "{:,.1f}"),
    ("GPU-h lost: restart overhead", "restart_overhead_gpu_hours", "{:,.1f}"),
    ("GPU-h lost to preemption", "preemption_lost_gpu_hours", "{:,.1f}"),
    ("quota violations", "quota_violations", "{:,}"),
    ("finished / unfinished", None, ""),
    ("wall time (s)", "wall_s", "{:,.0f}"),
)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * w for w in widths], *rows]
    cells = [
        [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        for line in lines
    ]
    return "\n".join("  ".join(line).rstrip() for line in cells)


def simulation_table(report: dict[str, Any]) -> str:
    """Return the simulation's runs side by side, with fifo / fairshare and plain / checkpoint-aware ratios."""
    names = [name for name in RUNS if name in report]
    rows = []
    for label, key, form in _ROWS:
        if key is None:
            cells = [f"{report[n]['finished']:,} / {report[n]['unfinished']:,}" for n in names]
        else:
            cells = [form.format(report[n][key]) for n in names]
        ratios = [
            f"{report[group][key]:.2f}x" if key in report[group] and report[group][key] is not None else ""
            for group in ("fifo_over_fairshare", "plain_over_checkpoint_aware")
        ]
        rows.append([label, *cells, *ratios])
    title = (
        f"Philly-derived, {report['fairshare']['jobs']:,} jobs, {report['gpus']} GPUs; a preempted job redoes its "
        f"work since its last checkpoint (every {report['checkpoint_interval_s']:g} s) and pays "
        f"{report['restart_overhead_s']:g} s to restart"
    )
    same = report["fairshare"]["same_states"]
    note = (
        f"\n\nOn the same states (the {same['passes_preempting']:,} passes where the fairshare run preempted):\n"
        f"checkpoint-aware victims lost {same['lost_progress_gpu_hours']:,.1f} GPU-h of progress "
        f"({same['preemptions']:,} preemptions), the plain choice would have lost "
        f"{same['plain_lost_progress_gpu_hours']:,.1f} ({same['plain_preemptions']:,} preemptions)."
    )
    return title + "\n\n" + _table(["", *names, "fifo/fairshare", "plain/aware"], rows) + note


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
    parser.add_argument("--checkpoint-interval", type=float, default=1800.0, metavar="SECONDS")
    parser.add_argument("--restart-overhead", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--lossless", action="store_true", help="also run fair share with free preemption")
    parser.add_argument("--workers", type=int, default=2, help="simulations run in this many processes")
    parser.add_argument("--skip-simulation", action="store_true")
    parser.add_argument("--pods", default="openb_pod_list_multigpu50.csv", help="pod list of the packing test")
    parser.add_argument("--json", type=Path, help="also write the full report (every summary) here")
    args = parser.parse_args()
    report: dict[str, Any] = {"packing": packing(args.pods)}
    print(packing_table(report["packing"]), end="\n\n", flush=True)
    if not args.skip_simulation:
        report["simulation"] = simulation(args)
        print(simulation_table(report["simulation"]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
