"""Real processes for the fault suite: each in its own process group, so SIGKILL takes the whole of it at once.

A crash (OOM kill, `docker kill`, a lost VM) ends a component and every
process it forked in the same instant; killing the group does the same. The
process runtime's supervisors start their own sessions, so the workloads a
killed agent or console launched keep running, as they would on a real node.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PYTHON = sys.executable


def free_port() -> int:
    """Return a loopback TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], object], timeout: float, *, interval: float = 0.2) -> bool:
    """Poll `predicate` until it is truthy or `timeout` seconds pass; return whether it became truthy."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class Proc:
    """One component: started, SIGKILLed and restarted as a whole process group, its output appended to a log."""

    def __init__(self, name: str, argv: list[str], *, env: dict[str, str], cwd: Path, log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.log_path = log_dir / f"{name}.log"
        self.popen: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.starts = 0

    def start(self) -> None:
        """Start the process (again); its log gets a separator line naming the start."""
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {self.starts} of {self.name} at {time.strftime('%H:%M:%S')} =====\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.started_at = time.monotonic()

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole process group, as a crash would, and reap the leader."""
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> None:
        """Ask the group to end (SIGTERM, then SIGINT), SIGKILL whatever is left after `timeout` seconds."""
        if self.popen is None:
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout / 2)
                break
        self.kill9()
        # Children that outlived their leader (a Celery pool process) go with the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def tail(self, lines: int = 40) -> str:
        """Return the last `lines` lines of the log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Busy:
    """`count` processes spinning on the CPU (`while 1: pass`), the issue's starved machine."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        self.procs = [
            subprocess.Popen([PYTHON, "-c", "while 1: pass"], start_new_session=True) for _ in range(self.count)
        ]

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        self.procs = []
