"""`gpucloud simulate`: replay a trace through the scheduler core and report (and optionally plot) the metrics."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jobs.scheduler.core import Ordering, ProjectQuota, TenantQuota
from jobs.scheduler.simulator.budgets import TenantBudget, parse_budget
from jobs.scheduler.simulator.build import POOL, default_quotas, gpu_hour_shares
from jobs.scheduler.simulator.engine import Settings, simulate
from jobs.scheduler.simulator.traces import load_trace


def parser() -> argparse.ArgumentParser:
    """Return the command-line parser (its --help is the reference)."""
    p = argparse.ArgumentParser(prog="gpucloud simulate", description=__doc__)
    p.add_argument("--trace", type=Path, required=True, help="a folder of ../shared/data/traces/")
    p.add_argument("--gpus", type=int, required=True, help="cluster size in GPUs")
    p.add_argument("--policy", choices=[o.value for o in Ordering], default=Ordering.FAIRSHARE.value)
    p.add_argument("--json", type=Path, help="write the metrics here")
    p.add_argument("--plot", type=Path, help="write a PNG of allocation and queue length per tenant here")
    p.add_argument("--limit-jobs", type=int, help="replay only the first N jobs (by arrival)")
    p.add_argument("--min-runtime", type=float, default=600.0, help="seconds before a job may be preempted")
    p.add_argument(
        "--checkpoint-interval",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="seconds between a job's checkpoints unless its trace says (default 0: never checkpoints)",
    )
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
        checkpoint_interval_s=args.checkpoint_interval,
        restart_overhead_s=args.restart_overhead,
        checkpoint_aware=not args.plain_victims,
        lossless_preemption=args.lossless_preemption,
        budgets=budgets,
    )


def main(argv: list[str]) -> int:
    """Run a simulation as the arguments say, print its metrics as JSON; return the exit status."""
    args = parser().parse_args(argv)
    try:
        trace = load_trace(args.trace, args.gpus, args.limit_jobs)
        capacity = sum(node.gpus for node in trace.nodes)
        tenant_quotas, project_quotas = quotas(args.quota, gpu_hour_shares(trace.jobs), capacity)
        budgets = tuple(parse_budget(text) for text in args.budget)
    except (OSError, ValueError) as error:
        print(f"simulate: {error}", file=sys.stderr)
        return 2
    if args.checkpoint_interval < 0 or args.restart_overhead < 0:
        print("simulate: --checkpoint-interval and --restart-overhead must not be negative", file=sys.stderr)
        return 2
    result = simulate(trace, run_settings(args, tenant_quotas, project_quotas, budgets))
    summary = {
        "trace": trace.name,
        "policy": args.policy,
        "min_runtime_s": args.min_runtime,
        "checkpoint_interval_s": args.checkpoint_interval,
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
