"""CPU of one agent sampling 8 simulated GPUs at 1 Hz, publishing every sample and heartbeating.

    REDIS_URL=redis://127.0.0.1:6379/1 .venv/bin/python bench/agent_sampling.py [--gpus 8] [--seconds 60]

Starts `gpucloud agent --node bench-agent --probe simulated` exactly as on a
node (a Celery worker on the node's queue, the sampler and heartbeat
thread), lets it warm up for 10 s, then reads its CPU time from /proc over
`--seconds` and reports it as a percentage of one core. Every sample goes
to the Redis channel layer and every heartbeat to the controller's mailbox,
as in production; the mailbox is emptied afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _proc import cpu_seconds, rss_mb

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    if not os.environ.get("REDIS_URL"):
        raise SystemExit("Set REDIS_URL: the agent reports through Redis.")
    with tempfile.TemporaryDirectory() as data_dir:
        env = {
            **os.environ,
            "GPUCLOUD_DATA_DIR": data_dir,
            "GPU_SAMPLE_SECONDS": "1",
            "SECRET_KEY": os.environ.get("SECRET_KEY") or "bench-" + "x" * 60,
        }
        command = [sys.executable, "-c", "from gpucloud.cli import main; main()", "agent", "--node", "bench-agent"]
        command += ["--probe", "simulated", "--simulated-gpus", str(args.gpus), "--loglevel", "WARNING"]
        agent = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(WARMUP)
            if agent.poll() is not None:
                raise SystemExit(f"the agent exited with {agent.returncode}")
            before, started = cpu_seconds(agent.pid), time.monotonic()
            time.sleep(args.seconds)
            used, wall = cpu_seconds(agent.pid) - before, time.monotonic() - started
            rss = rss_mb(agent.pid)
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
    import django

    django.setup()
    from inventory.mailbox import drain_reports

    reports = drain_reports(lambda batch: None)
    print(
        json.dumps(
            {
                "gpus": args.gpus,
                "sample_hz": 1,
                "measured_seconds": round(wall, 1),
                "cpu_percent_of_one_core": round(100 * used / wall, 2),
                "rss_mb": round(rss, 1),
                "heartbeat_reports_posted": reports,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
