"""Read-only SQL over the console's ledger (SQLite file or Postgres), the same for every version of the code.

The fault suite judges the ledger from outside: it never imports the
product's models, so one harness measures the code before and after a
change. Only the tables and columns every version has are read.
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ACTIVE = frozenset({"scheduled", "starting", "running"})
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "lost"})


@dataclass(frozen=True)
class WorkloadRow:
    id: int
    name: str
    kind: str
    state: str
    attempt: int
    reason_code: str
    exit_code: int | None
    gpus: int
    secret: str


@dataclass
class Snapshot:
    """The ledger at one instant: workloads by name, active allocations, GPUs, replicas, nodes."""

    workloads: dict[str, WorkloadRow] = field(default_factory=dict)
    # (workload id, GPU id, node id); the GPU is None for a CPU-only workload's allocation.
    allocations: list[tuple[int, int | None, int]] = field(default_factory=list)
    gpus: dict[int, tuple[int, bool]] = field(default_factory=dict)  # GPU id -> (node id, present)
    endpoints: dict[tuple[int, int], str] = field(default_factory=dict)  # (workload id, attempt) -> endpoint
    nodes: dict[int, tuple[str, str]] = field(default_factory=dict)  # node id -> (name, state)

    def by_id(self) -> dict[int, WorkloadRow]:
        return {row.id: row for row in self.workloads.values()}


_WORKLOADS = (
    "SELECT id, name, kind, state, attempt, reason_code, exit_code, gpus_per_replica * replicas, session_secret "
    "FROM jobs_workload"
)
_ALLOCATIONS = "SELECT workload_id, gpu_id, node_id FROM jobs_allocation WHERE released_at IS NULL"
_GPUS = "SELECT id, node_id, present FROM inventory_gpu"
_REPLICAS = "SELECT workload_id, attempt, endpoint FROM jobs_replica WHERE endpoint <> ''"
_NODES = "SELECT id, name, state FROM inventory_node"


class Ledger:
    """Snapshots of one console's database: `sqlite_path` (embedded) or `database_url` (Postgres)."""

    def __init__(self, *, sqlite_path: Path | None = None, database_url: str | None = None) -> None:
        if (sqlite_path is None) == (database_url is None):
            raise ValueError("give exactly one of sqlite_path and database_url")
        self.sqlite_path = sqlite_path
        self.database_url = database_url
        self._connection: Any = None

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        return list(self._execute(sql).fetchall())

    def _execute(self, sql: str) -> Any:
        if self._connection is None:
            self._connection = self._connect()
        return self._connection.execute(sql)

    def _connect(self) -> Any:
        if self.sqlite_path is not None:
            return sqlite3.connect(self.sqlite_path, timeout=10, isolation_level=None)
        import psycopg

        return psycopg.connect(self.database_url or "", autocommit=True, connect_timeout=5)

    def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.close()
            self._connection = None

    def snapshot(self) -> Snapshot:
        """Return the ledger now; raises (and forgets the connection) when the database cannot be read."""
        try:
            return self._snapshot()
        except Exception:
            self.close()
            raise

    def _snapshot(self) -> Snapshot:
        # One transaction, so the tables agree with each other (SQLite: a read transaction on one WAL snapshot).
        self._execute("BEGIN")
        try:
            workloads = self._rows(_WORKLOADS)
            allocations = self._rows(_ALLOCATIONS)
            gpus = self._rows(_GPUS)
            replicas = self._rows(_REPLICAS)
            nodes = self._rows(_NODES)
        finally:
            self._execute("COMMIT")
        snap = Snapshot()
        for wid, name, kind, state, attempt, reason, code, gpus_held, secret in workloads:
            snap.workloads[name] = WorkloadRow(wid, name, kind, state, attempt, reason or "", code, gpus_held, secret)
        snap.allocations = [(int(w), None if g is None else int(g), int(n)) for w, g, n in allocations]
        snap.gpus = {int(g): (int(n), bool(p)) for g, n, p in gpus}
        snap.endpoints = {(int(w), int(a)): str(e) for w, a, e in replicas}
        snap.nodes = {int(i): (str(name), str(state)) for i, name, state in nodes}
        return snap
