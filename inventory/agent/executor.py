"""The agent's side of execution: start, watch and stop replicas through the node's runtime.

The controller sends JSON messages (`jobs.services.execution.replica_spec`,
`jobs.services.stopping.stop_message`); this module turns them into driver
calls and reports back with tasks on the `control` queue:

- `jobs.replica_started` (handle, endpoint) once the runtime started or
  adopted the replica;
- `jobs.replica_ready` once a notebook's Jupyter answers its status URL;
- `jobs.ingest_log_batches` with the output, in batches chained by the
  runtime's log cursor (`since` -> `cursor`), so a redelivered batch is
  dropped and a restarted watcher resumes exactly where the ledger stopped.
  The node's batches travel together (`LogOutbox`): one message for all
  replicas at most every SHIP_SECONDS, not one per replica batch;
- `jobs.replica_exited` with the exit code when the replica ends (or when it
  could not be launched at all).

One watcher thread follows each replica; a second `watch` for a replica
already watched is a no-op. A replica stopped before its start message
arrived (the queue has several worker threads) is remembered, and the late
start is answered with an exit instead of a new container.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inventory.agent.config import AgentConfig, active_config, config_from_settings
from inventory.drivers import make_runtime
from inventory.drivers.base import (
    DriverError,
    DriverTimeout,
    Handle,
    PermanentDriverError,
    RemovableRuntime,
    Resources,
    Runtime,
    TransientDriverError,
    WorkloadSpec,
)
from inventory.drivers.timestamps import parse_ns

log = logging.getLogger(__name__)

START_TIMEOUT = 120.0
CALL_TIMEOUT = 30.0
FOLLOW_TIMEOUT = 300.0
# Output is shipped when this many lines are waiting or this many seconds passed since the first of them.
BATCH_LINES = 500
BATCH_SECONDS = 0.2
# A busy node's log batches leave together at most this often (a quiet node's at once).
SHIP_SECONDS = 0.1
# Batches the outbox keeps while the broker is unreachable; past this the newest are dropped (reconcile
# re-watches the replica from the stored cursor, so the runtime's own log fills the gap).
OUTBOX_CAPACITY = 5000
READY_TIMEOUT = 600.0
# While a runtime cannot be reached it is asked again this often; once it answers, the controller is asked
# to reconcile the node at once rather than at its next period (starts and watches cut short resume).
RECOVERY_POLL_SECONDS = 1.0
# What a replica's exit says when it ended while its runtime could not be reached: a Docker Engine reads a
# container's output, and one restarted after the container exited never reads what was printed meanwhile.
OUTPUT_GAP_NOTE = (
    "It exited while the node's container engine was down: what it printed after the engine stopped may be missing."
)
_REMEMBERED_OUTAGES = 20
_REMEMBERED_STOPS = 10_000


# A report (an exit, a start, the node's inventory) is what the controller cannot learn otherwise before
# the next reconcile: while the broker restarts, its send is retried for about a minute, not given up
# after Celery's default of well under a second. The agent's threads can afford to wait; web requests
# keep the short default.
REPORT_PUBLISH_RETRY = {"max_retries": 60, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0}


def report(task: str, **kwargs: Any) -> None:
    """Send one report to the controller; the broker keeps it while the controller is down.

    Log batches travel on the ingest queue, every other report on `control`
    (`gpucloud.control.queue_for`), so output never delays an exit report's turn.
    Raises what the broker raises once REPORT_PUBLISH_RETRY is spent.
    """
    from gpucloud.celery import app
    from gpucloud.control import queue_for

    app.send_task(task, kwargs=kwargs, queue=queue_for(task), retry=True, retry_policy=REPORT_PUBLISH_RETRY)


class LogOutbox:
    """The node's outgoing log batches: sent together, in order, and always before any other report.

    Watchers hand over their chained batches; a thread sends whatever
    waits as one `jobs.ingest_log_batches` message, at once when the node
    is quiet and at most every SHIP_SECONDS when it is busy. A node running
    fifty chatty replicas then sends ten messages a second instead of two
    hundred and fifty, and the controller's cost per message (a task
    dispatch) is paid once for all of them. Other reports flush the outbox
    first, so the controller never hears of an exit before the output that
    preceded it. A failed send keeps the batches for the next attempt.
    """

    def __init__(self, send: Callable[..., None]) -> None:
        self._send = send
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def put(self, batch: dict[str, Any]) -> None:
        """Queue one chained batch (`jobs.ingest_logs` arguments) for the next send."""
        with self._lock:
            if len(self._pending) >= OUTBOX_CAPACITY:
                log.warning("log outbox full: a batch of %s lines is dropped", len(batch.get("lines") or []))
                return
            self._pending.append(batch)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="log-outbox", daemon=True)
                self._thread.start()
        self._wake.set()

    def flush(self) -> None:
        """Send every waiting batch now, as one message; on failure keep them and log."""
        with self._lock:
            if not self._pending:
                return
            try:
                self._send("jobs.ingest_log_batches", batches=self._pending)
            except Exception:
                log.exception("sending %d log batches failed; they are kept for the next attempt", len(self._pending))
                return
            self._pending = []

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            self.flush()
            time.sleep(SHIP_SECONDS)


@dataclass(frozen=True)
class ReplicaRef:
    """Which replica a message is about, and where reports about it go."""

    node: str
    runtime: str
    name: str
    workload_id: int
    attempt: int
    replica: int

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> ReplicaRef:
        return cls(
            node=str(message["node"]),
            runtime=str(message["runtime"]),
            name=str(message["name"]),
            workload_id=int(message["workload_id"]),
            attempt=int(message["attempt"]),
            replica=int(message["replica"]),
        )

    def ids(self) -> dict[str, int]:
        return {"workload_id": self.workload_id, "attempt": self.attempt, "replica": self.replica}


class Executor:
    """Drives the runtimes of the nodes whose messages this process receives (one node, or simulated ones)."""

    def __init__(self, config: AgentConfig | None = None, *, send: Callable[..., None] | None = None) -> None:
        self._config = config
        # Where reports go: the controller's queue; tests inject a transport that loses them (a crashed agent).
        self._send: Callable[..., None] = send or report
        self.outbox = LogOutbox(self._send)
        self._runtimes: dict[tuple[str, str], Runtime] = {}
        self._watchers: dict[str, threading.Thread] = {}
        self._followers: dict[str, _Watcher] = {}  # the watcher each of those threads runs
        self._stopped: OrderedDict[str, None] = OrderedDict()
        self._starting: set[str] = set()
        # Per runtime, the last outages as [first failure, answered again] in epoch seconds; an end of inf is
        # an outage being waited out now.
        self._outages: dict[tuple[str, str], list[list[float]]] = {}
        self._lock = threading.Lock()

    def report(self, task: str, **kwargs: Any) -> None:
        """Send one report to the controller, after the log batches waiting before it."""
        self.outbox.flush()
        self._send(task, **kwargs)

    def runtime(self, kind: str, node: str) -> Runtime:
        """Return (and keep) the runtime of `kind` for `node`."""
        with self._lock:
            key = (kind, node)
            if key not in self._runtimes:
                config = self._config or active_config() or config_from_settings(node)
                self._runtimes[key] = make_runtime(
                    kind,
                    node_name=node,
                    work_dir=config.work_dir,
                    process_enabled=config.process_enabled,
                    docker_url=config.docker_url,
                    pull_images=config.pull_images,
                    publish_address=config.publish_address,
                )
            return self._runtimes[key]

    def runtime_unreachable(self, kind: str, node: str) -> None:
        """Note that the runtime of `node` failed a call; once it answers again, ask the controller to reconcile.

        An engine outage (a Docker Engine restart) cuts starts and log
        follows short, and only reconcile resumes them: waiting for its next
        period would leave work idle for up to WORKLOAD_RECONCILE_SECONDS
        after the engine is back. One waiter per runtime, whatever the
        number of failed calls.
        """
        with self._lock:
            windows = self._outages.setdefault((kind, node), [])
            if windows and windows[-1][1] == math.inf:
                return
            windows.append([time.time(), math.inf])
            del windows[:-_REMEMBERED_OUTAGES]
        threading.Thread(target=self._await_runtime, args=(kind, node), name=f"recover-{node}", daemon=True).start()

    def _await_runtime(self, kind: str, node: str) -> None:
        runtime = self.runtime(kind, node)
        try:
            while True:
                try:
                    runtime.list_managed(timeout=CALL_TIMEOUT)
                    break
                except DriverError:
                    time.sleep(RECOVERY_POLL_SECONDS)
        finally:
            with self._lock:
                self._outages[(kind, node)][-1][1] = time.time()  # ended, or given up: the next failure waits anew
        log.info("the %s runtime of %s answers again: asking for a reconcile", kind, node)
        self.report("jobs.reconcile")

    def recovering(self, kind: str, node: str) -> bool:
        """Whether an outage of that runtime is being waited out now."""
        with self._lock:
            windows = self._outages.get((kind, node), [])
            return bool(windows) and windows[-1][1] == math.inf

    def ended_unheard(self, kind: str, node: str, finished_at: str | None) -> bool:
        """Whether a replica that ended at `finished_at` (RFC 3339) did so while its runtime could not be reached."""
        if not finished_at:
            return False
        try:
            moment = parse_ns(finished_at) / 1e9
        except ValueError:
            return False
        with self._lock:
            windows = [tuple(window) for window in self._outages.get((kind, node), [])]
        # The first failure is noticed a moment after the engine stopped: a second of slack before it.
        return any(begin - 1.0 <= moment <= end for begin, end in windows)

    # --- start ---------------------------------------------------------------

    def start(self, spec: dict[str, Any]) -> None:
        """Start (or adopt) the replica `spec` describes, report it, and watch it until it ends.

        A start of a replica this agent is already starting is a no-op (the
        controller re-sends starts it has no answer for; the first one reports).
        """
        ref = ReplicaRef.from_message(spec)
        if self._was_stopped(ref.name):
            self.report("jobs.replica_exited", **ref.ids(), exit_code=None, message="Stopped before it started.")
            return
        with self._lock:
            if ref.name in self._starting:
                return
            self._starting.add(ref.name)
        try:
            self._start(ref, spec)
        finally:
            with self._lock:
                self._starting.discard(ref.name)

    def _start(self, ref: ReplicaRef, spec: dict[str, Any]) -> None:
        runtime = self.runtime(ref.runtime, ref.node)
        try:
            handle = runtime.start(driver_spec(spec), timeout=START_TIMEOUT)
        except TransientDriverError as error:
            # Slow or unreachable right now (a busy host): the replica may well be running. It is adopted
            # if it exists; otherwise nothing is reported, and reconcile sends the start again until the
            # controller's start timeout decides. A slow start is never reported as a failed one.
            log.warning("starting %s did not finish: %s", ref.name, error)
            self.runtime_unreachable(ref.runtime, ref.node)
            handle = self._find_quietly(runtime, ref.name)
            if not handle:
                return
        except Exception as error:
            # A permanent refusal (bad image, refused spec) will not improve: the controller decides
            # (fail the gang), not a retry loop here.
            log.warning("starting %s failed: %s", ref.name, error, exc_info=not isinstance(error, DriverError))
            self.report("jobs.replica_exited", **ref.ids(), exit_code=None, message=str(error), launch_failed=True)
            return
        self.watch_handle(
            ref, handle, log_cursor="", ready_path=spec.get("ready_path") or "", secret=spec.get("secret") or ""
        )

    def watch(self, message: dict[str, Any]) -> None:
        """Watch a replica the controller believes runs (reconcile), resuming its output at `log_cursor`."""
        ref = ReplicaRef.from_message(message)
        handle = message.get("handle") or {}
        if not handle:
            return
        self.watch_handle(
            ref,
            handle,
            log_cursor=message.get("log_cursor") or "",
            ready_path=message.get("ready_path") or "",
            secret=message.get("secret") or "",
            report_start=bool(message.get("report_start", True)),
            resend=bool(message.get("resend", False)),
        )

    def watch_handle(
        self,
        ref: ReplicaRef,
        handle: Handle,
        *,
        log_cursor: str,
        ready_path: str,
        secret: str,
        report_start: bool = True,
        resend: bool = False,
    ) -> None:
        """Report the replica started and follow it on a thread of its own, unless one already does.

        A new watcher reports the start unless it is a `resend`; an existing
        one's replica is reported again when `report_start` says the
        controller has not heard of it (its first report was lost, e.g. with a
        restarted broker). The report is idempotent. With `resend` (the
        controller's stored output stops short of what was shipped: a batch
        was lost on the way), a new watcher reads the output again from
        `log_cursor`, running or ended, and the current one stops shipping.
        """
        with self._lock:
            current = self._watchers.get(ref.name)
            thread: threading.Thread | None = None
            if resend or current is None or not current.is_alive():
                previous = self._followers.get(ref.name)
                if previous is not None:
                    previous.superseded.set()
                watcher = _Watcher(self, ref, handle, log_cursor, ready_path, secret)
                thread = threading.Thread(target=watcher.run, name=f"watch-{ref.name}", daemon=True)
                self._watchers[ref.name] = thread
                self._followers[ref.name] = watcher
        if (thread is not None and not resend) or report_start:
            self.report("jobs.replica_started", **ref.ids(), handle=handle, endpoint=str(handle.get("endpoint") or ""))
        if thread is not None:
            thread.start()

    def forget(self, watcher: _Watcher) -> None:
        """Drop `watcher`, which ended, unless a newer watcher of its replica took its place."""
        with self._lock:
            if self._followers.get(watcher.ref.name) is watcher:
                del self._followers[watcher.ref.name]
                self._watchers.pop(watcher.ref.name, None)

    # --- stop ------------------------------------------------------------------

    def stop(self, message: dict[str, Any]) -> None:
        """Stop the replica (SIGTERM, grace, SIGKILL), remove it if asked, and report its exit."""
        ref = ReplicaRef.from_message(message)
        self._remember_stop(ref.name)
        runtime = self.runtime(ref.runtime, ref.node)
        handle = message.get("handle") or self._find(runtime, ref.name)
        if not handle:
            self.report("jobs.replica_exited", **ref.ids(), exit_code=None, message="It was not running on the node.")
            return
        status = runtime.stop(handle, grace_seconds=float(message.get("grace_seconds", 30)), timeout=CALL_TIMEOUT)
        watcher = self._watchers.get(ref.name)
        if watcher is not None and watcher.is_alive():
            watcher.join(timeout=10)  # lets the watcher ship the last lines and report the exit itself
        self.report(
            "jobs.replica_exited", **ref.ids(), exit_code=status.exit_code, message=status.message or "Stopped."
        )
        if message.get("remove") and isinstance(runtime, RemovableRuntime):
            runtime.remove(handle, timeout=CALL_TIMEOUT)

    def _find_quietly(self, runtime: Runtime, name: str) -> Handle:
        """Return the handle of `name` on `runtime`, or {} when it is not there or the runtime cannot say."""
        try:
            return self._find(runtime, name)
        except DriverError:
            return {}

    def _find(self, runtime: Runtime, name: str) -> Handle:
        for managed in runtime.list_managed(timeout=CALL_TIMEOUT):
            if managed.name == name:
                return managed.handle
        return {}

    def _remember_stop(self, name: str) -> None:
        with self._lock:
            self._stopped[name] = None
            while len(self._stopped) > _REMEMBERED_STOPS:
                self._stopped.popitem(last=False)

    def _was_stopped(self, name: str) -> bool:
        with self._lock:
            return name in self._stopped

    # --- reconcile -------------------------------------------------------------

    def inventory_report(self, *, node: str, runtime: str, confirmed: list[str]) -> dict[str, Any]:
        """Return the node's own view for reconcile (`jobs.node_replicas` arguments), taken now.

        `managed`: every replica the runtime has, in any state; `starting`:
        replicas this agent is starting right now; `gone`: those of
        `confirmed` (replicas the controller heard were started before it
        asked) that the runtime no longer has and this agent is not
        starting. Only `gone` ever makes the controller declare a replica
        vanished: a replica is never judged by how late a message arrives.
        """
        with self._lock:
            starting = sorted(self._starting)
        managed = self.inventory(node=node, runtime=runtime)
        present = {item["name"] for item in managed} | set(starting)
        gone = [name for name in confirmed if name not in present]
        return {"node": node, "managed": managed, "starting": starting, "gone": gone}

    def inventory(self, *, node: str, runtime: str) -> list[dict[str, Any]]:
        """Return every replica the node's runtime manages, as JSON for `jobs.node_replicas`."""
        return [
            {
                "name": m.name,
                "workload_id": m.workload_id,
                "attempt": m.attempt,
                "replica": m.replica,
                "state": m.state,
                "handle": m.handle,
            }
            for m in self.runtime(runtime, node).list_managed(timeout=CALL_TIMEOUT)
        ]


def driver_spec(spec: dict[str, Any]) -> WorkloadSpec:
    """Return the driver's `WorkloadSpec` for the controller's JSON `spec`."""
    return WorkloadSpec(
        name=str(spec["name"]),
        workload_id=str(spec["workload_id"]),
        tenant=str(spec["tenant"]),
        attempt=int(spec["attempt"]),
        image=str(spec["image"]),
        command=[str(part) for part in spec.get("command") or []],
        env={str(k): str(v) for k, v in (spec.get("env") or {}).items()},
        gpu_uuids=[str(u) for u in spec.get("gpu_uuids") or []],
        resources=Resources(cpus=float(spec.get("cpus", 1.0)), memory_mb=int(spec.get("memory_mb", 1024))),
        replica=int(spec.get("replica", 0)),
        service_port=spec.get("service_port"),
        service_port_env=str(spec.get("service_port_env") or ""),
    )


class _Watcher:
    """Follows one replica: ships its output in chained batches, waits for readiness, reports its exit."""

    def __init__(
        self, executor: Executor, ref: ReplicaRef, handle: Handle, cursor: str, ready_path: str, secret: str
    ) -> None:
        self.executor = executor
        self.ref = ref
        self.handle = handle
        self.cursor = cursor
        self.ready_path = ready_path
        self.secret = secret
        self.lines: queue.Queue[tuple[str, str, str, str] | None] = queue.Queue()
        # Set when a newer watcher of the same replica took over (`Executor.watch_handle(resend=True)`).
        self.superseded = threading.Event()
        self.ended = threading.Event()

    def run(self) -> None:
        """Follow the replica to its end; then the executor forgets this watcher (an agent runs for months)."""
        try:
            self._follow()
        finally:
            self.ended.set()
            self.executor.forget(self)

    def _follow(self) -> None:
        runtime = self.executor.runtime(self.ref.runtime, self.ref.node)
        if self.ready_path and self.handle.get("endpoint"):
            threading.Thread(target=self._await_ready, name=f"ready-{self.ref.name}", daemon=True).start()
        reader = threading.Thread(target=self._read, args=(runtime,), name=f"logs-{self.ref.name}", daemon=True)
        reader.start()
        self._ship()
        if self.superseded.is_set():
            return  # the watcher that took over reports the exit
        try:
            status = runtime.poll(self.handle, timeout=CALL_TIMEOUT)
        except DriverError as error:
            log.warning("polling %s after its output ended failed: %s", self.ref.name, error)
            self.executor.runtime_unreachable(self.ref.runtime, self.ref.node)
            return  # reconcile watches it again
        if status.state in ("exited", "missing"):
            message = status.message or ("" if status.state == "exited" else "Its container is gone.")
            if self.executor.ended_unheard(self.ref.runtime, self.ref.node, status.finished_at):
                message = f"{message} {OUTPUT_GAP_NOTE}".strip()
            # A run its runtime lost track of (`unobserved`) ended in a way nobody knows: the controller runs
            # it again as a new attempt rather than calling it failed.
            lost = {"unobserved": True} if status.unobserved else {}
            self.executor.report(
                "jobs.replica_exited",
                **self.ref.ids(),
                exit_code=status.exit_code,
                message=message,
                log_cursor=self.cursor,  # where its output ends: the controller checks it stored all of it
                **lost,
            )

    def _read(self, runtime: Runtime) -> None:
        """Put every output line on the queue until the replica ends; None marks the end."""
        try:
            while True:
                try:
                    for line in runtime.logs(
                        self.handle, since=self.cursor or None, follow=True, timeout=FOLLOW_TIMEOUT
                    ):
                        if self.superseded.is_set():
                            return
                        self.lines.put((line.timestamp, line.stream, line.text, line.cursor))
                    return
                except DriverTimeout:
                    if self.superseded.is_set():
                        return
                    continue  # still running: follow on from the last line read
        except PermanentDriverError as error:
            log.info("output of %s is not available: %s", self.ref.name, error)
        except DriverError as error:
            log.warning("following %s failed: %s", self.ref.name, error)
            self.executor.runtime_unreachable(self.ref.runtime, self.ref.node)
        finally:
            self.lines.put(None)

    def _ship(self) -> None:
        """Send the queued lines in batches (full, or BATCH_SECONDS after their first line) until the end mark."""
        batch: list[tuple[str, str, str, str]] = []
        deadline: float | None = None
        while not self.superseded.is_set():
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                item = self.lines.get(timeout=wait)
            except queue.Empty:
                self._send(batch)
                batch, deadline = [], None
                continue
            if item is None:
                if batch:
                    self._send(batch)
                return
            batch.append(item)
            deadline = deadline if deadline is not None else time.monotonic() + BATCH_SECONDS
            if len(batch) >= BATCH_LINES:
                self._send(batch)
                batch, deadline = [], None

    def _send(self, batch: list[tuple[str, str, str, str]]) -> None:
        if self.superseded.is_set():
            return
        since, self.cursor = self.cursor, batch[-1][3]
        self.executor.outbox.put(
            {
                **self.ref.ids(),
                "since": since,
                "cursor": self.cursor,
                "lines": [[stamp, stream, text] for stamp, stream, text, _ in batch],
                # Each line's own cursor: a batch overlapping the stored chain continues it from there.
                "marks": [mark for _, _, _, mark in batch],
            }
        )

    def _await_ready(self) -> None:
        """Poll the service's status URL with the session's token until it answers 200, then report ready."""
        url = str(self.handle["endpoint"]).rstrip("/") + self.ready_path
        request = urllib.request.Request(url, headers={"Authorization": f"token {self.secret}"})  # noqa: S310 -- http only
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310 -- our own endpoint
                    if response.status == 200:
                        self.executor.report("jobs.replica_ready", **self.ref.ids())
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if self.ended.is_set() or self.superseded.is_set():
                return
            time.sleep(0.1)


_executor: Executor | None = None
_executor_lock = threading.Lock()


def executor() -> Executor:
    """Return this process's executor (one per process: the agent's, or the controller's for simulated nodes)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = Executor()
        return _executor
