"""The live displays in a real terminal (tmux, 160x40): `gpc ls --watch` and `gpc top` redraw as things change,
quit on `q` with exit code 0, and give the terminal back as it was (line mode, echo, the main screen)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from inventory.agent.probe import simulated_probe
from inventory.agent.runner import start_reporter
from inventory.drivers.simulated import SimulatedProbe, simulated_uuid
from inventory.tasks import apply_waiting_reports
from jobs.choices import WorkloadState
from tests.client.conftest import GPC, GPU_MODEL, GPUS, NODE, Gpc, Platform, reached
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.tmux]

IMAGE = "registry.example.com/team/train:1.0"
TMUX = shutil.which("tmux") or "tmux"  # the `tmux` marker skips (or fails, where required) without it
UTILIZATION = 50.0  # what the node's simulated GPUs report; the probe adds up to ±2 of noise


class Terminal:
    """A detached tmux session of 160x40 on a tmux server of its own, running one command."""

    def __init__(self, tmp_path: Path) -> None:
        self.socket = f"gpc-test-{uuid.uuid4().hex[:8]}"
        self.tmp_path = tmp_path

    def tmux(self, *args: str) -> str:
        done = subprocess.run([TMUX, "-L", self.socket, *args], capture_output=True, text=True, timeout=10, check=True)
        return done.stdout

    def run(self, gpc: Gpc, *args: str) -> None:
        """Start `gpc ARGS` in the session; afterwards the shell prints its exit code and the terminal's modes."""
        script = self.tmp_path / f"{self.socket}.sh"
        exports = {"GPUCLOUD_CONFIG": str(gpc.config), "NO_COLOR": "1"}
        script.write_text(
            "#!/bin/sh\nunset COLUMNS LINES\n"
            + "".join(f"export {name}={shlex.quote(value)}\n" for name, value in exports.items())
            + f"{shlex.join([str(GPC), *args])}\n"
            + 'printf "\\ngpc exited %s\\n" "$?"\n'
            # The modes a shell prompt needs back: canonical line input and echo ("-icanon" if left off).
            # The line ends in "(end)": a screen read while the shell is still printing it is not taken for it.
            + "printf 'modes: '\n"
            + "stty -a | tr ' ;' '\\n\\n' | grep -Ex -- '-?(icanon|echo)' | tr '\\n' ' '\n"
            + "echo '(end)'\nexec sleep 600\n"
        )
        script.chmod(0o700)
        self.tmux("new-session", "-d", "-x", "160", "-y", "40", "-s", "gpc", str(script))

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "gpc")

    def until(self, predicate: Callable[[str], object], timeout: float = 30.0) -> str:
        """Return the screen once `predicate(screen)` holds; fails showing the last screen when it does not."""
        seen = [""]

        def check() -> object:
            seen[0] = self.screen()
            return predicate(seen[0])

        assert wait_until(check, timeout=timeout, interval=0.2), f"the terminal shows:\n{seen[0]}"
        return seen[0]

    def alternate_screen(self) -> bool:
        return self.tmux("display-message", "-p", "-t", "gpc", "#{alternate_on}").strip() == "1"

    def quit_and_check_restored(self) -> str:
        """Press q; return the screen once gpc exited 0 and the terminal is in line mode with echo again."""
        self.tmux("send-keys", "-t", "gpc", "q")
        screen = self.until(lambda text: "gpc exited" in text and "(end)" in text)
        assert "gpc exited 0" in screen, screen
        assert re.search(r"(?m)^modes: icanon echo \(end\)\s*$", screen), f"terminal modes not restored:\n{screen}"
        assert not self.alternate_screen()
        return screen

    def close(self) -> None:
        subprocess.run([TMUX, "-L", self.socket, "kill-server"], capture_output=True, timeout=10, check=False)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    session = Terminal(tmp_path)
    try:
        yield session
    finally:
        session.close()


def _row(screen: str, workload_id: int) -> str | None:
    """Return the screen's line of the table row of `workload_id`, if it shows one."""
    return next((line for line in screen.splitlines() if line.split()[:1] == [str(workload_id)]), None)


def _submit(gpc: Gpc, name: str, command: str) -> int:
    done = gpc("-o", "json", "submit", "--image", IMAGE, "--pool", "shared", name, "--", "sh", "-c", command)
    assert done.returncode == 0, done.stderr
    workload_id: int = json.loads(done.stdout)["id"]
    return workload_id


def test_ls_watch_shows_a_new_workload_and_its_state_changes_live(platform: Platform, terminal: Terminal) -> None:
    terminal.run(platform.member, "ls", "--watch")
    terminal.until(lambda screen: "workloads of tenant-a" in screen and "NAME" in screen)

    watched = _submit(platform.member, "watched", "sleep 3")
    terminal.until(lambda screen: "watched" in (_row(screen, watched) or ""))
    terminal.until(lambda screen: "running" in (_row(screen, watched) or ""))
    screen = terminal.until(lambda screen: "succeeded" in (_row(screen, watched) or ""), timeout=45)
    reached(watched, WorkloadState.SUCCEEDED)
    assert "alpha" in (_row(screen, watched) or "")

    after = terminal.quit_and_check_restored()
    platform.member.check_secrets(screen + after)
    assert "watched" in after, "the last table stays on the terminal, as ls leaves it"


def test_top_shows_the_gpu_utilization_of_a_running_workload_then_gives_the_screen_back(
    platform: Platform, terminal: Terminal
) -> None:
    probe = simulated_probe(NODE, gpu_count=GPUS, model=GPU_MODEL)  # the one the agent's sampler reads
    assert isinstance(probe, SimulatedProbe)
    for index in range(GPUS):
        probe.set_utilization(simulated_uuid(NODE, index), UTILIZATION)
    reporter, sampling = start_reporter(platform.agent)  # the agent's sampler: samples every second
    try:
        busy = _submit(platform.member, "busy", "sleep 60")
        reached(busy, WorkloadState.RUNNING)
        terminal.run(platform.member, "top")
        screen = terminal.until(lambda screen: re.search(r"\d+%", _row(screen, busy) or ""))
        row = _row(screen, busy) or ""
        assert "busy" in row and NODE in row, screen
        percent = int(re.findall(r"(\d+)%", row)[0])
        assert UTILIZATION - 3 <= percent <= UTILIZATION + 3, row
        assert re.search(r"gpc top: member_a in tenant-a: 1 running, 1 GPUs?\b", screen), screen
        assert terminal.alternate_screen(), "top draws on the alternate screen, like top(1)"

        after = terminal.quit_and_check_restored()
        platform.member.check_secrets(screen + after)
        assert "gpc top:" not in after, "the screen from before top is back"
        assert platform.member("cancel", str(busy)).returncode == 0
    finally:
        reporter.stop()
        sampling.join(timeout=5)
        for index in range(GPUS):
            probe.set_utilization(simulated_uuid(NODE, index), None)
        apply_waiting_reports(wait_seconds=5)  # the heartbeats it sent: applied, as the console's beat would
