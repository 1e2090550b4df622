"""Time from the README's run command to the first HTTP 200, and the idle console's memory.

    .venv/bin/python bench/startup.py [--idle 20] [--fresh]

Runs `make run` with a fresh data directory on a free port and times the
first 200 from /login/; with --fresh it first clones this repository into a
temporary directory, so the virtualenv and node_modules are built from
scratch (from the warm pip and npm caches), as a newcomer's first run does.
Then it waits `--idle` seconds and reads the resident memory of the console
process from /proc. Embedded mode: DATABASE_URL and REDIS_URL are unset.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from _proc import descendants, rss_mb

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_200(url: str, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 -- loopback URL
                if response.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"no 200 from {url} within {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--fresh", action="store_true", help="run from a fresh clone (no .venv, no node_modules)")
    args = parser.parse_args()
    port = _free_port()
    with tempfile.TemporaryDirectory() as data_dir, tempfile.TemporaryDirectory() as clone:
        repo = ROOT
        if args.fresh:
            subprocess.run(["git", "clone", "-q", str(ROOT), clone], check=True)
            repo = Path(clone)
        environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        environ.update(
            GPUCLOUD_DATA_DIR=data_dir, GPUCLOUD_PORT=str(port), GPUCLOUD_ADMIN_PASSWORD="bench-password-1234"
        )
        started = time.monotonic()
        make = subprocess.Popen(
            ["make", "run"], cwd=repo, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _wait_for_200(f"http://127.0.0.1:{port}/login/", timeout=600)
            to_first_200 = time.monotonic() - started
            time.sleep(args.idle)
            processes = [make.pid, *descendants(make.pid)]
            rss = {pid: rss_mb(pid) for pid in processes if Path(f"/proc/{pid}").exists()}
            console_pid = max(rss, key=lambda pid: rss[pid])
        finally:
            for pid in [make.pid, *descendants(make.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)
            make.wait(timeout=30)
    result = {"fresh_clone": args.fresh, "seconds_to_first_200": round(to_first_200, 2)}
    print(json.dumps({**result, "idle_rss_mb": round(rss[console_pid], 1)}, indent=2))


if __name__ == "__main__":
    main()
