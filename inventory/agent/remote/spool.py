"""What the remote agent has to tell the console and has not delivered yet: a durable spool and live samples.

`Spool` is a FIFO of JSON messages in one SQLite file in the agent's work
directory. A message put is committed before `put` returns, so it is sent
after an agent crash or restart (WAL with synchronous=NORMAL survives a
killed process; a power loss may lose the last commits). The spool is
bounded by bytes: when full, the oldest heartbeats go first (the next
heartbeat carries the node's state again), and only then the oldest of
anything else; every drop is counted and logged. One process at a time
owns a spool (an exclusive lock beside it), so two agents started with
the same work directory never send the same messages twice.

`LiveSamples` holds the latest GPU samples only, in memory: they are for
the live views, worthless once stale, so they never touch the disk.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inventory.agent.remote import RemoteAgentError

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
LIVE_KIND = "samples"
# What the spool drops first when full: the newest heartbeat carries the node's state again.
EXPENDABLE_KIND = "heartbeat"
SAMPLES_MAX_AGE = 10.0

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS spool ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, body TEXT NOT NULL, size INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS spool_kind ON spool (kind, id)",
)


class SpoolLocked(RemoteAgentError):
    """Another process holds the spool: an agent of this node already runs with this work directory."""


@dataclass(frozen=True)
class Spooled:
    """One message read from the head of the spool: its id (ascending in spool order), the message and its size."""

    id: int
    message: dict[str, Any]
    size: int


class Spool:
    """A durable, bounded FIFO of JSON messages; thread-safe. `on_put` is called after every message put."""

    def __init__(
        self, path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, on_put: Callable[[], None] | None = None
    ) -> None:
        self.path, self.max_bytes, self.on_put = path, max_bytes, on_put
        self.dropped = 0
        self._lock = threading.Lock()
        self._lock_file = _take_lock(path.with_name(path.name + ".lock"))
        _create_private(path)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        for statement in _SCHEMA:
            self._db.execute(statement)
        self._bytes = int(self._db.execute("SELECT COALESCE(SUM(size), 0) FROM spool").fetchone()[0])

    def put(self, message: dict[str, Any]) -> None:
        """Append `message` (a JSON object with a `kind`), durably; make room by the drop policy when full.

        Raises ValueError for a live `samples` message (see `LiveSamples`)
        and TypeError for one that is not JSON; a single message larger
        than the whole bound is dropped (and counted), never stored.
        """
        kind = str(message["kind"])
        if kind == LIVE_KIND:
            raise ValueError("samples are live only: hand them to LiveSamples, not to the spool")
        body = json.dumps(message, separators=(",", ":"))
        size = len(body.encode())
        with self._lock:
            if not self._make_room(size):
                return
            self._db.execute("INSERT INTO spool (kind, body, size) VALUES (?, ?, ?)", (kind, body, size))
            self._bytes += size
        if self.on_put is not None:
            self.on_put()

    def head(self, *, max_messages: int = 500, max_bytes: int = 1024 * 1024) -> list[Spooled]:
        """Return the oldest messages in order: at most `max_messages`, and `max_bytes` unless one alone is larger."""
        taken: list[Spooled] = []
        total = 0
        with self._lock:
            rows = self._db.execute("SELECT id, body, size FROM spool ORDER BY id LIMIT ?", (max_messages,))
            for row_id, body, size in rows:
                if taken and total + size > max_bytes:
                    break
                taken.append(Spooled(row_id, json.loads(body), size))
                total += size
            rows.close()
        return taken

    def delete_through(self, last_id: int) -> None:
        """Delete every message up to and including `last_id` (a batch `head` returned, delivered or refused)."""
        with self._lock:
            rows = self._db.execute("DELETE FROM spool WHERE id <= ? RETURNING size", (last_id,)).fetchall()
            self._bytes -= sum(size for (size,) in rows)

    @property
    def bytes(self) -> int:
        """The bytes of JSON waiting."""
        return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0])

    def close(self) -> None:
        """Close the database and release the lock (another agent may take the spool then)."""
        with self._lock:
            self._db.close()
            self._lock_file.close()

    def _make_room(self, size: int) -> bool:
        """Drop old messages until `size` more bytes fit; return False (and count a drop) when it never can."""
        if size > self.max_bytes:
            self._count_drops(0, 1, reason=f"a message of {size} bytes is larger than the whole spool")
            return False
        excess = self._bytes + size - self.max_bytes
        if excess <= 0:
            return True
        heartbeats = self._drop_oldest(excess, kind=EXPENDABLE_KIND)
        others = self._drop_oldest(excess - heartbeats[1], kind=None) if heartbeats[1] < excess else (0, 0)
        self._count_drops(heartbeats[0], others[0], reason=f"the spool is full ({self.max_bytes} bytes)")
        return True

    def _drop_oldest(self, excess: int, *, kind: str | None) -> tuple[int, int]:
        """Delete the oldest messages (of `kind`, or any) until `excess` bytes are freed; return (count, bytes)."""
        if excess <= 0:
            return 0, 0
        rows = (
            self._db.execute("SELECT id, size FROM spool WHERE kind = ? ORDER BY id", (kind,))
            if kind
            else self._db.execute("SELECT id, size FROM spool ORDER BY id")
        )
        victims: list[int] = []
        freed = 0
        for row_id, size in rows:
            victims.append(row_id)
            freed += size
            if freed >= excess:
                break
        rows.close()
        if victims:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("DELETE FROM spool WHERE id = ?", [(row_id,) for row_id in victims])
            self._db.execute("COMMIT")
        self._bytes -= freed
        return len(victims), freed

    def _count_drops(self, heartbeats: int, others: int, *, reason: str) -> None:
        self.dropped += heartbeats + others
        log.warning(
            "%s: dropped %d heartbeats and %d other messages (%d dropped since the agent started)",
            reason,
            heartbeats,
            others,
            self.dropped,
        )


def _take_lock(path: Path) -> Any:
    """Open and exclusively lock `path` (never blocking); raises SpoolLocked when another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    handle = open(path, "a")  # noqa: SIM115  # held open for the spool's life: closing it releases the lock
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise SpoolLocked(f"another agent process uses the spool {path.parent}: stop it first") from None
    return handle


def _create_private(path: Path) -> None:
    """Create the spool file owner-only before SQLite opens it: it holds workloads' output (SQLite's WAL copies it)."""
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


@dataclass(frozen=True)
class Snapshot:
    """The latest samples and when (monotonic) they were taken."""

    samples: list[dict[str, Any]]
    at: float


class LiveSamples:
    """The node's latest GPU samples, in memory only; `take` hands them out once while at most `max_age` old."""

    def __init__(
        self,
        *,
        max_age: float = SAMPLES_MAX_AGE,
        on_put: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_age, self.on_put, self.clock = max_age, on_put, clock
        self._latest: Snapshot | None = None
        self._lock = threading.Lock()

    def put(self, samples: list[dict[str, Any]]) -> None:
        """Replace the latest samples with `samples`."""
        with self._lock:
            self._latest = Snapshot(samples, self.clock())
        if self.on_put is not None:
            self.on_put()

    def take(self) -> Snapshot | None:
        """Return the latest samples and forget them; None when there are none, or they are stale (dropped)."""
        with self._lock:
            latest, self._latest = self._latest, None
        if latest is None or self.clock() - latest.at > self.max_age:
            return None
        return latest

    def give_back(self, snapshot: Snapshot) -> None:
        """Keep `snapshot` (its send failed) for the next batch, unless newer samples arrived meanwhile."""
        with self._lock:
            if self._latest is None:
                self._latest = snapshot
