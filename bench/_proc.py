"""What /proc says about a process tree: descendants, CPU seconds, resident memory (Linux only)."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    # The command name may hold spaces and parentheses; the fields start after the last ")".
    return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]).split()


def descendants(pid: int) -> list[int]:
    """Return the pids of every process below `pid`."""
    children: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int(_stat_fields(int(entry.name))[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                children += [int(entry.name), *descendants(int(entry.name))]
    return children


def cpu_seconds(pid: int) -> float:
    """Return user + system CPU seconds used so far by `pid` and its live descendants."""
    total = 0
    for each in [pid, *descendants(pid)]:
        try:
            fields = _stat_fields(each)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLOCK_TICKS


def rss_mb(pid: int) -> float:
    """Return the resident memory of `pid` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def oldest_named(name: str) -> int | None:
    """Return the pid of the oldest process whose command name is `name` (a server's parent), or None."""
    found: list[tuple[int, int]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() == name:
                found.append((int(_stat_fields(int(entry.name))[19]), int(entry.name)))  # starttime
        except (OSError, IndexError, ValueError):
            continue
    return min(found)[1] if found else None
