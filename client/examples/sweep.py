"""Submit a sweep of 20 jobs (one learning rate each) and wait for all of them, with gpucloud's Python client.

    python client/examples/sweep.py --image registry.example.com/team/train:1.0 --project vision
    python client/examples/sweep.py --image ... --project vision --async     # the same with AsyncClient

It talks to the console of the current `gpc login` context (or GPUCLOUD_URL and GPUCLOUD_TOKEN, for CI),
asks the API to validate the whole sweep, submits it in one all-or-nothing bulk request (with an
Idempotency-Key, so a retried request never submits twice), waits for every job, prints one line per job
and exits 0 when all succeeded, else with the first failure's exit code (as `gpc submit --wait` does).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from typing import Any

from gpucloud_client import ApiError, AsyncClient, Client, ClientError, Config, Context, WorkloadDetail
from gpucloud_client.errors import exit_code_for_workload


def sweep_items(image: str, command: str, count: int, gpus: int, pool: str | None) -> list[dict[str, Any]]:
    """Return `count` submission bodies: `command` with `{lr}` (and `{index}`) filled in for each job."""
    items = []
    for index in range(count):
        lr = 10 ** (-1 - 3 * index / max(1, count - 1))  # 1e-1 down to 1e-4, evenly on a log scale
        item: dict[str, Any] = {
            "name": f"sweep-{index:02d}",
            "image": image,
            "command": shlex.split(command.format(lr=f"{lr:.2e}", index=index)),
            "gpus_per_replica": gpus,
            "env": {"SWEEP_INDEX": str(index)},
        }
        if pool:
            item["pool"] = pool
        items.append(item)
    return items


def run_sync(context: Context, project: str, items: list[dict[str, Any]]) -> list[WorkloadDetail]:
    """Validate, submit and wait with the blocking client; return every job as it ended."""
    with Client(context) as gpc:
        gpc.validate_bulk(project, items)  # ApiError naming every bad field of every item; writes nothing
        jobs = gpc.submit_bulk(project, items)
        print(f"submitted {len(jobs)} jobs: {jobs[0].id}..{jobs[-1].id}", file=sys.stderr)
        return [gpc.wait(job.id) for job in jobs]  # each wait follows the events stream, not a busy poll


async def run_async(context: Context, project: str, items: list[dict[str, Any]]) -> list[WorkloadDetail]:
    """The same with AsyncClient: the 20 waits run at once."""
    async with AsyncClient(context) as gpc:
        await gpc.validate_bulk(project, items)
        jobs = await gpc.submit_bulk(project, items)
        print(f"submitted {len(jobs)} jobs: {jobs[0].id}..{jobs[-1].id}", file=sys.stderr)
        return list(await asyncio.gather(*(gpc.wait(job.id) for job in jobs)))


def report(finals: list[WorkloadDetail]) -> int:
    """Print one line per job; return 0 when all succeeded, else the first failure's exit code."""
    codes = []
    for job in finals:
        code = exit_code_for_workload(job.state, job.exit_code)
        codes.append(code)
        print(f"{job.id}\t{job.name}\t{job.state}\texit {job.exit_code if job.exit_code is not None else '-'}")
    return next((code for code in codes if code != 0), 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True, help="image of every job")
    parser.add_argument("--command", default="python train.py --lr {lr}", help="command; {lr} and {index} filled in")
    parser.add_argument("--project", help="project (default: the context's)")
    parser.add_argument("--pool", help="node pool (default: the console's)")
    parser.add_argument("--count", type=int, default=20, help="jobs in the sweep (default 20)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per job (default 1)")
    parser.add_argument("--async", dest="use_async", action="store_true", help="use AsyncClient")
    args = parser.parse_args()

    try:
        context = Config.load().resolve()
        project = args.project or context.project
        if not project:
            parser.error("name a --project (or log in with `gpc login URL --project SLUG`)")
        items = sweep_items(args.image, args.command, args.count, args.gpus, args.pool)
        finals = (
            asyncio.run(run_async(context, project, items)) if args.use_async else run_sync(context, project, items)
        )
    except ApiError as error:
        print(f"error: {error}", file=sys.stderr)  # the message, then one line per field and rule
        return error.exit_code
    except ClientError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return error.exit_code
    return report(finals)


if __name__ == "__main__":
    sys.exit(main())
