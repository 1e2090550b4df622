"""Supervisor of one process-runtime workload: `python -m inventory.drivers.process._supervisor DIR`.

Started by `ProcessRuntime.start`, it detaches (forks, the parent exits)
so it outlives the controller that launched it, then:

1. claims DIR by creating `supervisor.pid` exclusively (a second
   supervisor for the same workload exits with status 3);
2. runs the command of `launch.json` in a new session (its own process
   group) with exactly the environment given there, as its `user`
   (`{"uid", "gid", "groups"}`: set with setgid, setgroups and setuid
   before the command starts) when one is given;
3. writes `state.json` (its own and the command's pid, and their start
   times, so a recycled pid is never mistaken for them);
4. appends every output line to `log.jsonl` as `{"ts", "stream", "text"}`
   with the time it was read;
5. when the command exits, kills what is left of its process group and
   writes `exit.json` (`exit_code`, 128 + N for a death by signal N).

Every file it writes is its owner's alone (0600): the command, run as
another user, can read none of them.

Stdlib only, so it starts fast and depends on nothing but the files in DIR.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

MAX_LINE_BYTES = 64 * 1024
CLAIM = "supervisor.pid"
LAUNCH = "launch.json"
STATE = "state.json"
EXIT = "exit.json"
LOG = "log.jsonl"


def now_rfc3339() -> str:
    """Return the current UTC time as RFC 3339 with nanoseconds."""
    ns = time.time_ns()
    seconds, fraction = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{fraction:09d}Z"


def start_time(pid: int) -> int | None:
    """Return the start time of `pid` in clock ticks since boot (Linux /proc), or None when it does not exist."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write `data` to `path` atomically (a reader sees all of it or nothing), readable by its owner only."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(data))
    os.replace(temporary, path)


class LogWriter:
    """Appends timestamped lines of both streams to one JSON-lines file, in the order they are read."""

    def __init__(self, path: Path) -> None:
        self._file = os.fdopen(os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o600), "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, stream: str, text: str) -> None:
        with self._lock:
            # Stamped under the lock, so timestamps never go backwards in the file.
            self._file.write(json.dumps({"ts": now_rfc3339(), "stream": stream, "text": text}) + "\n")
            self._file.flush()

    def pump(self, source: IO[bytes], stream: str) -> None:
        for raw in iter(lambda: source.readline(MAX_LINE_BYTES), b""):
            self.write(stream, raw.decode("utf-8", "replace").removesuffix("\n"))

    def close(self) -> None:
        self._file.close()


def exit_code(returncode: int) -> int:
    """Return a shell-style exit code: 128 + N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def supervise(directory: Path) -> int:
    """Run the workload of `directory` to its end; return this supervisor's own exit status."""
    try:
        fd = os.open(directory / CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return 3
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    launch = json.loads((directory / LAUNCH).read_text())
    writer = LogWriter(directory / LOG)
    started = now_rfc3339()
    if not launch["command"]:
        # No image here to take a default command from: fail at once, saying so, rather than hang the launch.
        _record_failure(directory, writer, started, "the process runtime runs no image: give the workload a command")
        return 0
    try:
        child = subprocess.Popen(  # noqa: S603 -- the workload's own command, checked by the runtime
            launch["command"],
            env=launch["env"],
            cwd=launch["cwd"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **_identity(launch.get("user")),
        )
    except (OSError, ValueError) as error:  # ValueError: an argument Popen refuses (a NUL byte)
        code = 127 if isinstance(error, FileNotFoundError) else 126
        _record_failure(directory, writer, started, f"cannot run the command: {error}", code=code)
        return 0
    # Ignored only now: a disposition set before the spawn would be inherited by the command.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    me = os.getpid()
    state = {"supervisor_pid": me, "supervisor_start": start_time(me), "pid": child.pid, "pgid": child.pid}
    write_json(directory / STATE, {**state, "child_start": start_time(child.pid), "started_at": started})
    assert child.stdout is not None and child.stderr is not None  # both are pipes
    readers = [
        threading.Thread(target=writer.pump, args=(child.stdout, "stdout"), daemon=True),
        threading.Thread(target=writer.pump, args=(child.stderr, "stderr"), daemon=True),
    ]
    for reader in readers:
        reader.start()
    returncode = child.wait()
    # Like a container's end: nothing the command left behind keeps running.
    with contextlib.suppress(OSError):
        os.killpg(child.pid, signal.SIGKILL)
    for reader in readers:
        reader.join(timeout=5.0)
    writer.close()
    write_json(directory / EXIT, {"exit_code": exit_code(returncode), "finished_at": now_rfc3339()})
    return 0


def _identity(user: dict[str, Any] | None) -> dict[str, Any]:
    """Return Popen's arguments that run the command as `user`: its uid, gid and exactly its groups (none else)."""
    if user is None:
        return {}
    return {"user": int(user["uid"]), "group": int(user["gid"]), "extra_groups": [int(g) for g in user["groups"]]}


def _record_failure(directory: Path, writer: LogWriter, started: str, why: str, *, code: int = 127) -> None:
    """The command could not be started: say `why` on stderr, record exit `code` (127 not found, 126 not runnable)."""
    writer.write("stderr", why)
    writer.close()
    me = os.getpid()
    state = {"supervisor_pid": me, "supervisor_start": start_time(me), "pid": None, "pgid": None}
    write_json(directory / STATE, {**state, "child_start": None, "started_at": started})
    write_json(directory / EXIT, {"exit_code": code, "finished_at": now_rfc3339(), "message": why})


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m inventory.drivers.process._supervisor DIR", file=sys.stderr)
        return 2
    if os.fork() > 0:
        return 0  # the launcher reaps this parent at once; the child is adopted by init
    os._exit(supervise(Path(argv[0])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
