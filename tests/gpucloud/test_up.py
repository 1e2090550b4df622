"""`gpucloud up`, the README's run command, as a newcomer runs it: a real process on a real port."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.task_names import SCHEDULE_PASS

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free_port_pair() -> int:
    """Return a loopback port P with P + 1 free too: `up` serves notebooks on the next port by default.

    A port from bind(0) alone often has its neighbour held by an outgoing connection (Linux hands bind and
    connect ports of alternate parity), e.g. a parallel test worker's pooled database connection.
    """
    for _ in range(100):
        port = _free_port()
        with socket.socket() as first, socket.socket() as second:
            try:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two free neighbouring loopback ports")


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 -- loopback URL built by the test
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@dataclass
class Run:
    """One run of the console: where it listens, and everything it printed (filled in when it stops)."""

    base: str
    output: str = ""


@contextmanager
def console(data_dir: Path, *, extra_args: list[str] | None = None, **extra: str) -> Iterator[Run]:
    """Run `gpucloud up` (with `extra_args`) in embedded mode on a free port until the block ends."""
    port = _free_port_pair()
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "GPUCLOUD_ADMIN_PASSWORD")}
    # This machine becomes a process-runtime node unless a test asks otherwise: no Docker Engine is asked.
    environ.update(GPUCLOUD_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1", GPUCLOUD_LOCAL_NODE="process")
    environ.update(extra)
    process = subprocess.Popen(
        [sys.executable, "-c", "from gpucloud.cli import main; main()", "up", "--port", str(port), *(extra_args or [])],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run = Run(base=f"http://127.0.0.1:{port}")
    base = run.base
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(
                    f"gpucloud up exited with {process.returncode}:\n{process.stdout.read() if process.stdout else ''}"
                )
            try:
                if _get(f"{base}/healthz")[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("gpucloud up did not answer within 90 s")
        yield run
    finally:
        process.send_signal(signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        run.output = output


def test_up_serves_the_console_and_creates_the_operator_once(tmp_path: Path) -> None:
    with console(tmp_path) as first:
        base = first.base
        status, body = _get(f"{base}/login/")
        assert status == 200 and b"<form" in body
        stylesheet = re.search(rb'href="(/static/[^"]+\.css)"', body)
        assert stylesheet, "the login page links its stylesheet"
        assert _get(f"{base}{stylesheet.group(1).decode()}")[0] == 200
        assert _get(f"{base}/api/v1/me/")[0] == 401
    assert "first operator account created" in first.output
    match = re.search(r"User name: +admin\n +Password: +(\S+)\n", first.output)
    assert match, first.output
    assert len(match.group(1)) >= 16
    assert (tmp_path / "gpucloud.sqlite3").exists()

    with console(tmp_path) as second:
        assert _get(f"{second.base}/healthz")[0] == 200
    assert "first operator account created" not in second.output, "a second start must reuse the existing account"
    assert "User name:    admin" in second.output and "printed at the first start" in second.output


def test_up_takes_the_operator_password_from_the_environment(tmp_path: Path) -> None:
    with console(
        tmp_path, GPUCLOUD_ADMIN_USERNAME="root-op", GPUCLOUD_ADMIN_PASSWORD="a-long-enough-passphrase"
    ) as run:
        pass
    output = run.output
    assert "User name:    root-op" in output and "Password:     the one in GPUCLOUD_ADMIN_PASSWORD" in output
    assert "a-long-enough-passphrase" not in output


def test_up_stays_quiet_so_the_address_and_the_password_stay_on_screen(tmp_path: Path) -> None:
    """Periodic work (a pass and a heartbeat batch every second) logs at DEBUG only: after ten seconds the
    first operator's password and the console's address are still among the last lines a terminal shows."""
    with console(tmp_path) as run:
        time.sleep(10)
    # The test's own requests (waiting for /healthz) are logged by uvicorn, one line each: not periodic work.
    lines = [line for line in run.output.splitlines() if line.strip() and '"GET ' not in line]
    assert not [line for line in lines if SCHEDULE_PASS in line or "apply_heartbeats" in line], lines
    assert len(lines) <= 24, "\n".join(lines)
    assert any("first operator account created" in line for line in lines)
    assert any(f"gpucloud console on {run.base}" in line for line in lines)
