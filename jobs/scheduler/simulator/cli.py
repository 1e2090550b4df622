"""`gpucloud simulate`: replay a trace, or the console's own recorded workloads, through the scheduler core and
report (and optionally plot) the metrics, with what the run assumed (`assumptions` in the JSON).

Time limits are drawn as users submit them (`users.LimitModel`; `--max-runtime`, `--no-limits`), checkpoints
from a realistic mix (`users.CheckpointMix`; `--checkpoint-interval`, `--no-checkpoints`), predictions learned
from completed jobs (`predictor.py`), usage decayed with `--decay-half-life`; `--eta` measures the core's start
estimates. docs/simulator.md describes the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jobs.scheduler.core import Ordering, ProjectQuota, TenantQuota
from jobs.scheduler.simulator.budgets import TenantBudget, parse_budget
from jobs.scheduler.simulator.build import POOL, default_quotas, gpu_hour_shares
from jobs.scheduler.simulator.engine import DEFAULT_HALF_LIFE_S, Settings, simulate
from jobs.scheduler.simulator.traces import Trace, load_trace
from jobs.scheduler.simulator.users import DEFAULT_MAX_RUNTIME_S, CheckpointMix, LimitModel


def parser() -> argparse.ArgumentParser:
    """Return the command-line parser (its --help is the reference)."""
    p = argparse.ArgumentParser(prog="gpucloud simulate", description=__doc__)
    p.add_argument("--trace", type=Path, help="a folder of ../shared/data/traces/ (or --from-console)")
    p.add_argument("--gpus", type=int, help="cluster size in GPUs (with --trace)")
    p.add_argument(
        "--from-console",
        action="store_true",
        help="replay the console's own finished workloads on its pools and nodes, with its real quotas",
    )
    p.add_argument("--since", type=float, metavar="DAYS", help="with --from-console: only workloads of the last DAYS")
    p.add_argument("--policy", choices=[o.value for o in Ordering], default=Ordering.FAIRSHARE.value)
    p.add_argument("--json", type=Path, help="write the metrics here")
    p.add_argument("--plot", type=Path, help="write a PNG of allocation and queue length per tenant here")
    p.add_argument("--limit-jobs", type=int, help="replay only the first N jobs (by arrival)")
    p.add_argument("--min-runtime", type=float, default=600.0, help="seconds before a job may be preempted")
    p.add_argument("--seed", type=int, default=0, help="seed of every per-job draw (limits, checkpoints; default 0)")
    p.add_argument(
        "--max-runtime",
        type=float,
        default=DEFAULT_MAX_RUNTIME_S,
        metavar="SECONDS",
        help="the pool's maximum time limit: some users ask for it, none gets more (default 7 days)",
    )
    p.add_argument("--no-limits", action="store_true", help="jobs have no time limit (the model before)")
    p.add_argument(
        "--no-chains",
        action="store_true",
        help="a job longer than the maximum is killed there for good (default: it continues as a chain of jobs)",
    )
    p.add_argument(
        "--checkpoint-interval",
        type=float,
        metavar="SECONDS",
        help="force this interval between checkpoints on every job (0: none checkpoints); default: the mix, "
        "40%% of jobs every 15, 30 or 60 minutes",
    )
    p.add_argument("--no-checkpoints", action="store_true", help="no job checkpoints (same as --checkpoint-interval 0)")
    p.add_argument(
        "--decay-half-life",
        type=float,
        default=DEFAULT_HALF_LIFE_S,
        metavar="SECONDS",
        help="half-life of the decayed usage fair share reads (default 7 days, Slurm's PriorityDecayHalfLife)",
    )
    p.add_argument("--eta", action="store_true", help="ask the core for start estimates and measure their error")
    p.add_argument("--no-predictions", action="store_true", help="no run-time predictions (predicted_s unset)")
    p.add_argument(
        "--restart-overhead",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="run time a preempted job pays again when it restarts (default 60)",
    )
    p.add_argument(
        "--plain-victims",
        action="store_true",
        help="choose preemption victims newest first, ignoring checkpoints (SchedulerConfig.checkpoint_aware off)",
    )
    p.add_argument(
        "--lossless-preemption",
        action="store_true",
        help="the model before: a preempted job keeps all its progress and restarts at no cost",
    )
    p.add_argument(
        "--quota",
        action="append",
        default=[],
        metavar="TENANT=GUARANTEED[:LIMIT[:WEIGHT]]",
        help="override a tenant's quota (repeatable); default: guarantees proportional to GPU-hours",
    )
    p.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="TENANT=GPU_HOURS[:ACTION]",
        help="give a tenant a GPU-hour budget over the whole trace (repeatable); ACTION at the cap: refuse_new, "
        "stop_borrowing (the default) or stop_running",
    )
    return p


def quotas(
    overrides: list[str], shares: dict[str, float], capacity: int
) -> tuple[tuple[TenantQuota, ...], tuple[ProjectQuota, ...]]:
    """Return the default quotas with `overrides` applied; raises ValueError on a malformed override."""
    tenants, _ = default_quotas(shares, capacity)
    by_tenant = {q.tenant: q for q in tenants}
    for override in overrides:
        tenant, _, spec = override.partition("=")
        parts = spec.split(":")
        if not tenant or not spec or len(parts) > 3:
            raise ValueError(f"--quota {override!r}: expected TENANT=GUARANTEED[:LIMIT[:WEIGHT]]")
        guaranteed = int(parts[0])
        limit = int(parts[1]) if len(parts) > 1 else capacity
        weight = float(parts[2]) if len(parts) > 2 else float(max(1, guaranteed))
        by_tenant[tenant] = TenantQuota(tenant, POOL, guaranteed, limit, weight)
    final = tuple(by_tenant[t] for t in sorted(by_tenant))
    return final, tuple(ProjectQuota(q.tenant, q.tenant, POOL, q.guaranteed, q.limit, 1.0) for q in final)


def run_settings(
    args: argparse.Namespace,
    tenant_quotas: tuple[TenantQuota, ...],
    project_quotas: tuple[ProjectQuota, ...],
    budgets: tuple[TenantBudget, ...] = (),
) -> Settings:
    """Return the simulation settings the parsed arguments ask for."""
    return Settings(
        Ordering(args.policy),
        tenant_quotas,
        project_quotas,
        args.min_runtime,
        checkpoint_interval_s=0.0 if args.no_checkpoints else args.checkpoint_interval,
        restart_overhead_s=args.restart_overhead,
        checkpoint_aware=not args.plain_victims,
        lossless_preemption=args.lossless_preemption,
        budgets=budgets,
        seed=args.seed,
        limits=None if args.no_limits else LimitModel(max_runtime_s=args.max_runtime),
        checkpoints=CheckpointMix(),
        predictions=not args.no_predictions,
        decay_half_life_s=args.decay_half_life,
        estimates=args.eta,
        chains=not args.no_chains,
    )


def _problem(args: argparse.Namespace) -> str | None:
    """Return what is wrong with the arguments together, or None."""
    if args.from_console == (args.trace is not None):
        return "give either --trace DIR --gpus N or --from-console"
    if args.trace is not None and args.gpus is None:
        return "--trace needs --gpus"
    if args.from_console and args.quota:
        return "--from-console uses the console's own quotas: --quota does not apply"
    if (args.checkpoint_interval or 0) < 0 or args.restart_overhead < 0:
        return "--checkpoint-interval and --restart-overhead must not be negative"
    if args.max_runtime <= 0 or args.decay_half_life <= 0:
        return "--max-runtime and --decay-half-life must be positive"
    return None


def load(args: argparse.Namespace) -> tuple[Trace, tuple[TenantQuota, ...], tuple[ProjectQuota, ...]]:
    """Return the trace and quotas the arguments name; raises OSError or ValueError."""
    if args.from_console:
        from jobs.scheduler.simulator.console import console_trace  # Django loads only for the console's own data

        return console_trace(args.since)
    trace = load_trace(args.trace, args.gpus, args.limit_jobs)
    capacity = sum(node.gpus for node in trace.nodes)
    return (trace, *quotas(args.quota, gpu_hour_shares(trace.jobs), capacity))


def main(argv: list[str]) -> int:
    """Run a simulation as the arguments say, print its metrics as JSON; return the exit status."""
    args = parser().parse_args(argv)
    problem = _problem(args)
    if problem is not None:
        print(f"simulate: {problem}", file=sys.stderr)
        return 2
    try:
        trace, tenant_quotas, project_quotas = load(args)
        budgets = tuple(parse_budget(text) for text in args.budget)
    except (OSError, ValueError) as error:
        print(f"simulate: {error}", file=sys.stderr)
        return 2
    capacity = sum(node.gpus for node in trace.nodes)
    settings = run_settings(args, tenant_quotas, project_quotas, budgets)
    result = simulate(trace, settings)
    summary = {
        "trace": trace.name,
        "policy": args.policy,
        "seed": args.seed,
        "min_runtime_s": args.min_runtime,
        "checkpoint_interval_s": settings.checkpoint_interval_s,
        "restart_overhead_s": args.restart_overhead,
        "victims": "newest_first" if args.plain_victims else "checkpoint_aware",
        "lossless_preemption": args.lossless_preemption,
        **result.summary,
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    if args.plot:
        from jobs.scheduler.simulator.plot import save_plot  # matplotlib loads only when a plot is asked

        save_plot(result.series, args.plot, f"{trace.name}, {capacity} GPUs, {args.policy}")
    return 0
