"""Time from the README's run command to the first HTTP 200, what it printed meanwhile, and the idle memory.

    .venv/bin/python bench/startup.py [--idle 20] [--fresh] [--demo] [--show-output]

Runs `make run PORT=<free port>` with a fresh data directory and times the
first 200 from /login/; with --fresh it first copies this working tree
(tracked and untracked files, not what git ignores: no .venv, no
node_modules, no data) into a temporary directory, so the virtualenv and
node_modules are built from scratch (from the warm pip and npm caches), as a
newcomer's first run of a fresh clone does, without touching this checkout's
.venv. It reports the seconds to the closing banner (the console's address
and sign-in) and to the first page, how many lines `make run` printed
before the banner (its progress), and, after `--idle` seconds, the resident
memory of the console process from /proc. Embedded mode: DATABASE_URL and
REDIS_URL are unset; this machine becomes node `local` as on any first
start (GPUCLOUD_LOCAL_NODE from the environment, default auto).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO

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


def _copy_working_tree(target: Path) -> Path:
    """Copy the files git tracks or would track (not the ignored: .venv, node_modules, data) to `target`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


class Transcript:
    """Every line `make run` prints, with the second it appeared, read on a thread of its own."""

    def __init__(self, stream: IO[str], started: float) -> None:
        self.lines: list[tuple[float, str]] = []
        self._started = started
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append((time.monotonic() - self._started, line.rstrip("\n")))

    def seconds_to(self, text: str) -> float | None:
        return next((round(at, 2) for at, line in self.lines if text in line), None)

    def before(self, text: str) -> list[str]:
        shown: list[str] = []
        for _, line in self.lines:
            if text in line:
                break
            shown.append(line)
        return [line for line in shown if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--fresh", action="store_true", help="run from a fresh copy (no .venv, no node_modules)")
    parser.add_argument("--demo", action="store_true", help="make run DEMO=1: add the simulated demo fleet")
    parser.add_argument("--show-output", action="store_true", help="also print what make run printed")
    args = parser.parse_args()
    port = _free_port()
    with tempfile.TemporaryDirectory() as data_dir, tempfile.TemporaryDirectory() as copy:
        repo = _copy_working_tree(Path(copy)) if args.fresh else ROOT
        environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        environ.update(GPUCLOUD_DATA_DIR=data_dir, PYTHONUNBUFFERED="1")
        command = ["make", "run", f"PORT={port}", *(["DEMO=1"] if args.demo else [])]
        started = time.monotonic()
        make = subprocess.Popen(
            command, cwd=repo, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert make.stdout is not None
        transcript = Transcript(make.stdout, started)
        try:
            _wait_for_200(f"http://127.0.0.1:{port}/login/", timeout=900)
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
    progress = transcript.before("gpucloud console on")
    result = {
        "fresh_copy": args.fresh,
        "demo": args.demo,
        "seconds_to_banner": transcript.seconds_to("gpucloud console on"),
        "seconds_to_first_200": round(to_first_200, 2),
        "lines_before_banner": len(progress),
        "idle_rss_mb": round(rss[console_pid], 1),
    }
    if args.show_output:
        result["output"] = [f"{at:7.1f}s  {line}" for at, line in transcript.lines]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
