"""Turn `pip install`'s output into a few lines of progress, for `make run` and `make test`.

    pip install -r requirements.lock | python tools/install_progress.py --total 132

pip prints two or three lines per package (a wall of a few hundred lines for
gpucloud's lock), or nothing at all with --quiet, and the slowest step
(unpacking every package) prints nothing however verbose it is. This filter
reads pip's standard output and shows what is happening instead: how many
packages were collected out of the lock's total, how many were downloaded
rather than found on this machine (pip's cache or local wheels), and a
clock while pip installs them. On a terminal it keeps one status line up to
date; elsewhere (CI logs, a file) it prints a line at each quarter of the
collection and one every 15 s of the install. pip's standard error
(warnings, errors) is not read: it reaches the terminal as pip wrote it.
Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TextIO

TICK_SECONDS = 1.0
# A quiet step longer than this prints a reminder line when the output is not a terminal.
LOG_REMINDER_SECONDS = 15.0


@dataclass
class Progress:
    """What pip has done so far, and how to show it on `out`."""

    total: int
    out: TextIO
    tty: bool
    started: float = field(default_factory=time.monotonic)
    collected: int = 0
    downloaded: int = 0
    current: str = ""
    installing: int = 0
    quarters_shown: int = 0
    finished: bool = False
    last_line_at: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def elapsed(self) -> int:
        return int(time.monotonic() - self.started)

    def status(self) -> str:
        """Return the one line that says where the install stands."""
        if self.installing:
            return f"  installing {self.installing} packages (unpacking, the longest step) ... {self.elapsed()} s"
        cached = self.collected - self.downloaded
        return (
            f"  collected {self.collected}/{self.total} packages "
            f"({self.downloaded} downloaded, {cached} already on this machine) {self.current}"
        )

    def show(self, *, final: str = "") -> None:
        """Redraw the status line on a terminal; on a log, print only the milestones (and `final`)."""
        with self.lock:
            if self.finished:
                return
            if self.tty:
                line = final or self.status()
                self.out.write("\r\033[K" + line[:160] + ("\n" if final else ""))
            else:
                line = final or self._milestone()
                if not line:
                    return
                self.out.write(line + "\n")
            self.out.flush()
            self.last_line_at = time.monotonic()

    def _milestone(self) -> str:
        if self.installing:
            quiet_for = time.monotonic() - self.last_line_at
            return self.status() if quiet_for >= LOG_REMINDER_SECONDS else ""
        quarter = 4 * self.collected // max(self.total, 1)
        if quarter > self.quarters_shown:
            self.quarters_shown = quarter
            return self.status().rstrip()
        return ""

    def read(self, line: str) -> None:
        """Take one line of pip's output into account."""
        # "Processing <wheel>": a package found as a local file (pip's find-links) rather than on an index.
        collecting = re.match(r"(?:Collecting|Processing) (\S+)", line)
        if collecting:
            self.collected += 1
            found = collecting.group(1).rsplit("/", 1)[-1]
            self.current = found.split("-")[0] if found.endswith(".whl") else found
        elif line.lstrip().startswith("Downloading "):
            self.downloaded += 1
        elif line.startswith("Installing collected packages:"):
            self.installing = len(line.split(":", 1)[1].split(","))
            self.quarters_shown = 4
            self.show(final="" if self.tty else self.status())
            return
        elif line.startswith("Successfully installed"):
            count = len(line.split()) - 2
            self.installing = 0
            self.show(final=f"  installed {count} packages in {self.elapsed()} s")
            self.finished = True  # the clock stops: nothing more to say
            return
        else:
            return
        self.show()


def _tick(progress: Progress, stop: threading.Event) -> None:
    """Keep the clock moving while pip prints nothing (resolving, unpacking)."""
    while not stop.wait(TICK_SECONDS):
        progress.show()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total", type=int, required=True, help="packages in the lock file")
    args = parser.parse_args(argv)
    progress = Progress(total=args.total, out=sys.stdout, tty=sys.stdout.isatty())
    stop = threading.Event()
    threading.Thread(target=_tick, args=(progress, stop), daemon=True).start()
    try:
        for line in sys.stdin:
            progress.read(line.rstrip("\n"))
    finally:
        stop.set()
    if progress.tty and not progress.finished:
        progress.out.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
