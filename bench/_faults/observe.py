"""Watching a run from outside: the ledger, the processes and the notebooks, checked every second.

Each poll reads the ledger in one transaction, lists the run's live
processes from /proc and (every few seconds) asks each notebook's Jupyter
for its status with the session secret, then lists what is wrong now:

- a workload not in its true final state and not running (a job's exit
  code decides succeeded or failed; a notebook must run and serve);
- a workload the ledger runs without a live process, or a live process the
  ledger does not run (an orphan);
- a GPU with two active allocations, a node with more allocated GPUs than it
  has, an allocation held by a workload that no longer runs, a running
  workload holding other than the GPUs it asked for.

The run has converged from the last poll at which that list became empty,
if it stays empty to the end. Queue lengths are sampled beside it: Redis
`LLEN` of every list every 0.5 s (distributed), or the file the embedded
console's launcher writes (`launch.py --queue-samples`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from _faults.ledger import ACTIVE, TERMINAL, Ledger, Snapshot, WorkloadRow
from _faults.truth import Design, notebook_serving, running_processes

POLL_SECONDS = 1.0
NOTEBOOK_PROBE_SECONDS = 3.0


@dataclass
class Watch:
    """Workloads not ended when a component went down; done once each runs again or truly ended."""

    since: float
    names: frozenset[str]
    done_at: float | None = None


@dataclass
class Observer:
    """Polls the invariants on a thread; the scenario tells it when the fault ends and what to watch."""

    ledger: Ledger
    designs: dict[str, Design]
    run_id: str
    started: float = field(default_factory=time.monotonic)
    fault_end: float | None = None
    polls: int = 0
    unreadable_polls: int = 0
    unreadable_error: str = ""
    last: Snapshot | None = None
    last_processes: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    bad_since_fault_end: bool = False
    converged_at: float | None = None
    double_allocated_gpus: set[int] = field(default_factory=set)
    over_allocation_max: int = 0
    first_terminal: dict[str, tuple[float, str, str, int]] = field(default_factory=dict)
    serving: dict[str, bool] = field(default_factory=dict)
    ever_served: set[str] = field(default_factory=set)
    orphans_seen: set[tuple[int, int]] = field(default_factory=set)
    violation_counts: Counter[str] = field(default_factory=Counter)
    watches: list[Watch] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _probed_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="faults-observer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.ledger.close()

    def now(self) -> float:
        return time.monotonic()

    def mark_fault_end(self) -> None:
        with self._lock:
            self.fault_end = time.monotonic()
            self.converged_at = None
            self.bad_since_fault_end = False

    def watch_unfinished(self, snap: Snapshot, since: float) -> Watch:
        """Watch the workloads `snap` shows submitted and not ended: done once each runs again or truly ended."""
        names = frozenset(n for n, row in snap.workloads.items() if row.state not in TERMINAL and n in self.designs)
        watch = Watch(since=since, names=names)
        with self._lock:
            self.watches.append(watch)
        return watch

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.poll()
            self._stop.wait(max(0.0, POLL_SECONDS - (time.monotonic() - began)))

    def poll(self) -> None:
        """Take one sample: read the ledger and the processes, list the violations, update the records."""
        now = time.monotonic()
        try:
            snap = self.ledger.snapshot()
        except Exception as error:
            self.unreadable_polls += 1
            self.unreadable_error = f"{type(error).__name__}: {error}"
            self._record(now, ["ledger_unreadable"])
            return
        processes = running_processes(self.run_id)
        if now - self._probed_at >= NOTEBOOK_PROBE_SECONDS:
            self._probe_notebooks(snap)
            self._probed_at = now
        self.last, self.last_processes = snap, processes
        self.polls += 1
        self._record(now, self.check(snap, processes, now))

    def _probe_notebooks(self, snap: Snapshot) -> None:
        for name, design in self.designs.items():
            row = snap.workloads.get(name)
            if design.kind != "notebook" or row is None:
                continue
            endpoint = snap.endpoints.get((row.id, row.attempt))
            served = bool(endpoint) and notebook_serving(endpoint or "", row.id, row.secret)
            self.serving[name] = served
            if served:
                self.ever_served.add(name)

    def check(self, snap: Snapshot, processes: dict[tuple[int, int], list[int]], now: float) -> list[str]:
        """Return what is wrong in this sample (empty when the run is consistent)."""
        wrong: list[str] = []
        for name, design in self.designs.items():
            row = snap.workloads.get(name)
            if row is None:
                continue  # not submitted yet
            if row.state in TERMINAL and name not in self.first_terminal:
                self.first_terminal[name] = (now, row.state, row.reason_code, row.attempt)
            wrong += self._workload_problems(design, row, processes)
        wrong += self._orphans(snap, processes)
        wrong += self._allocation_problems(snap)
        self._update_watches(snap, processes, now)
        return wrong

    def _workload_problems(
        self, design: Design, row: WorkloadRow, processes: dict[tuple[int, int], list[int]]
    ) -> list[str]:
        if row.state in TERMINAL:
            return [] if row.state == design.true_state else [f"wrong_final:{row.name}"]
        if row.state != "running":
            return [f"in_transit:{row.name}"]
        if (row.id, row.attempt) not in processes:
            return [f"running_without_process:{row.name}"]
        if design.kind == "notebook" and not self.serving.get(row.name, False):
            return [f"not_serving:{row.name}"]
        return []

    def _orphans(self, snap: Snapshot, processes: dict[tuple[int, int], list[int]]) -> list[str]:
        rows = snap.by_id()
        found = []
        for workload_id, attempt in processes:
            row = rows.get(workload_id)
            if row is None or row.state not in ACTIVE or row.attempt != attempt:
                found.append(f"orphan:{workload_id}/{attempt}")
                self.orphans_seen.add((workload_id, attempt))
        return found

    def _allocation_problems(self, snap: Snapshot) -> list[str]:
        wrong: list[str] = []
        gpu_allocations = [(w, g, n) for w, g, n in snap.allocations if g is not None]
        per_gpu = Counter(gpu for _, gpu, _ in gpu_allocations)
        for gpu, count in per_gpu.items():
            if count > 1:
                self.double_allocated_gpus.add(gpu)
                wrong.append(f"double_allocation:gpu{gpu}")
        present = Counter(node for node, ok in snap.gpus.values() if ok)
        held = Counter(node for _, _, node in gpu_allocations)
        over = sum(max(0, count - present.get(node, 0)) for node, count in held.items())
        self.over_allocation_max = max(self.over_allocation_max, over)
        if over:
            wrong.append(f"over_allocation:{over}")
        rows = snap.by_id()
        for workload_id in {workload for workload, _, _ in snap.allocations}:
            row = rows.get(workload_id)
            if row is None or row.state not in ACTIVE | {"preempted"}:
                wrong.append(f"leaked_allocation:{row.name if row else workload_id}")
        holding = Counter(workload for workload, _, _ in gpu_allocations)
        for row in snap.workloads.values():
            if row.state in ACTIVE and holding.get(row.id, 0) != row.gpus:
                wrong.append(f"allocation_mismatch:{row.name}")
        return wrong

    def _update_watches(self, snap: Snapshot, processes: dict[tuple[int, int], list[int]], now: float) -> None:
        for watch in self.watches:
            if watch.done_at is not None or now < watch.since:
                continue
            if all(self._running_again(snap.workloads.get(name), name, processes) for name in watch.names):
                watch.done_at = now

    def _running_again(self, row: WorkloadRow | None, name: str, processes: dict[tuple[int, int], list[int]]) -> bool:
        if row is None:
            return False
        design = self.designs[name]
        if row.state in TERMINAL:
            return row.state == design.true_state
        running = row.state == "running" and (row.id, row.attempt) in processes
        return running and (design.kind != "notebook" or self.serving.get(name, False))

    def _record(self, now: float, wrong: list[str]) -> None:
        with self._lock:
            self.violations = wrong
            for item in wrong:
                self.violation_counts[item.split(":", 1)[0]] += 1
            if self.fault_end is None or now < self.fault_end:
                return
            if wrong:
                self.bad_since_fault_end = True
                self.converged_at = None
            elif self.converged_at is None:
                self.converged_at = now

    def converge_seconds(self) -> float | None:
        """Seconds from the fault's end to the poll from which everything has held; None if it does not hold now."""
        if self.fault_end is None or self.converged_at is None or self.violations:
            return None
        return round(max(0.0, self.converged_at - self.fault_end), 1)


class QueueSampler:
    """Samples queue lengths every 0.5 s: Redis lists (distributed) or the embedded launcher's file.

    Distributed, a queue's length is its Redis list (`LLEN`); `unacked:<queue>`
    beside it counts the messages workers took and have not acknowledged.
    Embedded, it is the transport's queue plus what the console's workers
    took and have not started.
    """

    def __init__(self, *, redis_url: str | None = None, samples_file: Path | None = None) -> None:
        self.redis_url = redis_url
        self.samples_file = samples_file
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.redis_url is not None:
            self._thread = threading.Thread(target=self._run, name="faults-queues", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.samples_file is not None:
            self.samples = list(_read_samples(self.samples_file))

    def _run(self) -> None:
        import redis

        client = redis.Redis.from_url(self.redis_url or "", socket_timeout=2, socket_connect_timeout=2)
        while not self._stop.wait(0.5):
            with contextlib.suppress(redis.RedisError):
                self.samples.append((time.time(), _redis_lists(client)))

    def maxima(self) -> dict[str, int]:
        """Return the largest length seen of each queue (Celery's priority sub-queues counted with their queue)."""
        top: dict[str, int] = {}
        for _, sizes in self.samples:
            merged: Counter[str] = Counter()
            for name, size in sizes.items():
                merged[name.split("\x06\x16", 1)[0]] += size
            for name, size in merged.items():
                top[name] = max(top.get(name, 0), size)
        return dict(sorted(top.items()))


def _redis_lists(client: object) -> dict[str, int]:
    # Redis deletes an emptied list, so the control queue is asked for by name.
    sizes: dict[str, int] = {"control": int(client.llen("control"))}  # type: ignore[attr-defined]
    # Delivered and not acknowledged (taken by a worker, waiting or running; acks are late): a figure beside.
    for raw in client.hvals("unacked"):  # type: ignore[attr-defined]
        with contextlib.suppress(ValueError, IndexError, TypeError):
            name = f"unacked:{json.loads(raw)[2]}"
            sizes[name] = sizes.get(name, 0) + 1
    for key in client.scan_iter(count=1000):  # type: ignore[attr-defined]
        name = key.decode(errors="replace")
        if name.startswith(("asgi", "_kombu", "celery-task-meta")):
            continue
        if client.type(key) == b"list":  # type: ignore[attr-defined]
            sizes[name] = int(client.llen(key))  # type: ignore[attr-defined]
    return sizes


def _read_samples(path: Path) -> list[tuple[float, dict[str, int]]]:
    samples = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        with contextlib.suppress(ValueError, KeyError):
            data = json.loads(line)
            sizes = {str(k): int(v) for k, v in data["queues"].items()}
            # Taken by a worker and not started is still waiting (older launchers wrote no "held").
            for name, held in (data.get("held") or {}).items():
                sizes[str(name)] = sizes.get(str(name), 0) + int(held)
            samples.append((float(data["t"]), sizes))
    return samples
