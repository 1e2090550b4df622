"""`gpc logs -f` follows a log live through a console restart: every line once, in order, none lost."""

from __future__ import annotations

import json
import subprocess
import threading
from functools import partial

import pytest

from jobs.choices import WorkloadState
from jobs.models import Workload
from tests.client.conftest import Platform, reached
from tests.workers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

IMAGE = "registry.example.com/team/train:1.0"
LINES = 500
# 10 s or more of output, a line every 20 ms or so: time to drop the connection twice while it runs.
COUNTING = f"i=1; while [ $i -le {LINES} ]; do echo line-$i; i=$((i+1)); sleep 0.02; done"


class Reader:
    """Collects what a process prints on stdout, line by line, on a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        self._stdout = process.stdout
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stdout:
            self.lines.append(line.rstrip("\n"))

    def printed(self, count: int) -> bool:
        """Return whether at least `count` lines were printed."""
        return len(self.lines) >= count

    def join(self) -> list[str]:
        self._thread.join(timeout=10)
        return self.lines


def test_logs_follow_resumes_after_the_console_drops_its_connection_without_gap_or_repeat(
    platform: Platform,
) -> None:
    gpc = platform.member
    done = gpc("-o", "json", "submit", "--image", IMAGE, "--pool", "shared", "counting", "--", "sh", "-c", COUNTING)
    assert done.returncode == 0, done.stderr
    workload_id = json.loads(done.stdout)["id"]
    reached(workload_id, WorkloadState.RUNNING)

    argv = gpc.argv("logs", "-f", str(workload_id))
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=gpc.env()) as follower:
        reader = Reader(follower)
        restarted_after: list[int] = []
        try:
            for seen in (40, 150):
                assert wait_until(partial(reader.printed, seen), timeout=30), reader.lines[-3:]
                restarted_after.append(len(reader.lines))
                platform.console.restart()  # uvicorn closes every WebSocket (1012) and listens again on the port
                assert Workload.all_tenants.get(pk=workload_id).state == WorkloadState.RUNNING, "it ran on meanwhile"
                assert len(reader.lines) < LINES
            code = follower.wait(timeout=60)
        finally:
            if follower.poll() is None:
                follower.kill()
        stderr = follower.stderr.read() if follower.stderr else ""
    gpc.check_secrets(stderr)
    assert code == 0, stderr
    assert reader.join() == [f"line-{i}" for i in range(1, LINES + 1)]
    assert Workload.all_tenants.get(pk=workload_id).state == WorkloadState.SUCCEEDED
    # It connected three times: from the start, then twice after the last line it had printed.
    opened = [stream for stream in platform.console.streams if stream.startswith(f"/ws/workloads/{workload_id}/logs/")]
    assert len(opened) == 3, opened
    assert opened[0].endswith("?after=0")
    resumed = [int(stream.rsplit("after=", 1)[1]) for stream in opened[1:]]
    assert all(printed <= seq for printed, seq in zip(restarted_after, resumed, strict=True)), (restarted_after, opened)

    whole = gpc("logs", str(workload_id))
    assert whole.stdout.splitlines() == [f"line-{i}" for i in range(1, LINES + 1)]
    tail = gpc("logs", "--tail", "3", str(workload_id))
    assert tail.stdout.splitlines() == [f"line-{i}" for i in range(LINES - 2, LINES + 1)]


def test_logs_follow_of_a_job_that_just_ended_prints_every_line_it_wrote(platform: Platform) -> None:
    """A job's last output is still being stored for a moment after it ended (log batches and the exit travel
    on different queues): following it then must wait for them, not stop at what is stored so far."""
    gpc = platform.member
    burst = 100_000  # written in one go just before it exits
    done = gpc("-o", "json", "submit", "--image", IMAGE, "--pool", "shared", "burst", "--", "seq", str(burst))
    assert done.returncode == 0, done.stderr
    workload_id = json.loads(done.stdout)["id"]
    reached(workload_id, WorkloadState.SUCCEEDED)
    stored_at_end = Workload.all_tenants.get(pk=workload_id).log_seq
    followed = gpc("logs", "-f", str(workload_id))
    assert followed.returncode == 0, followed.stderr
    printed = followed.stdout.splitlines()
    assert len(printed) == burst and printed[-1] == str(burst), (
        f"printed {len(printed)} lines, the last {printed[-1:]}; {stored_at_end} were stored when it ended"
    )
