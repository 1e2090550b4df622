"""The agent's side of execution: start, watch and stop replicas through the node's runtime.

The controller sends protocol messages (`common.protocol.messages`:
`StartReplica`, `StopReplica`, `WatchReplica`, decoded by the tasks in
`inventory.agent.tasks`); this module turns them into driver calls and
reports back with messages of that module, as tasks on the `control` queue:

- `jobs.replica_pulling` while the runtime pulls the replica's image as
  part of its start (about once a second, and when the pull is done; see
  `pulls`);
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

The parts live next to this module: `outbox` (how reports leave),
`pulls` (image pull progress, sent beside the start), `replicas` (the
messages as driver inputs), `outages` (runtimes that cannot be reached)
and `watcher` (one replica followed to its end). Their public
names are re-exported here.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from common.protocol.messages import (
    Reconcile,
    ReplicaExited,
    ReplicaSpec,
    ReplicaStarted,
    StopReplica,
    WatchReplica,
)
from common.protocol.wire import Message
from inventory.agent.config import AgentConfig, active_config, config_from_settings
from inventory.agent.outages import OUTPUT_GAP_NOTE, RECOVERY_POLL_SECONDS, RuntimeOutages
from inventory.agent.outbox import OUTBOX_CAPACITY, REPORT_PUBLISH_RETRY, SHIP_SECONDS, LogOutbox, report
from inventory.agent.pulls import PullReports
from inventory.agent.replicas import CALL_TIMEOUT, ReplicaRef, driver_spec
from inventory.agent.watcher import BATCH_LINES, BATCH_SECONDS, FOLLOW_TIMEOUT, READY_TIMEOUT, Watcher
from inventory.drivers import make_runtime
from inventory.drivers.base import (
    DriverError,
    Handle,
    Ownership,
    RemovableRuntime,
    Runtime,
    TransientDriverError,
)

__all__ = [
    "BATCH_LINES",
    "BATCH_SECONDS",
    "CALL_TIMEOUT",
    "FOLLOW_TIMEOUT",
    "OUTBOX_CAPACITY",
    "OUTPUT_GAP_NOTE",
    "READY_TIMEOUT",
    "RECOVERY_POLL_SECONDS",
    "REPORT_PUBLISH_RETRY",
    "SHIP_SECONDS",
    "START_TIMEOUT",
    "Executor",
    "LogOutbox",
    "ReplicaRef",
    "driver_spec",
    "executor",
    "install_executor",
    "report",
]

log = logging.getLogger(__name__)

START_TIMEOUT = 120.0
_REMEMBERED_STOPS = 10_000


class Executor:
    """Drives the runtimes of the nodes whose messages this process receives (one node, or simulated ones)."""

    def __init__(self, config: AgentConfig | None = None, *, send: Callable[..., None] | None = None) -> None:
        self._config = config
        # Where reports go: the controller's queue; tests inject a transport that loses them (a crashed agent).
        self._send: Callable[..., None] = send or report
        self.outbox = LogOutbox(self._send)
        self.pulls = PullReports(self._send)
        self._runtimes: dict[tuple[str, str], Runtime] = {}
        self._watchers: dict[str, threading.Thread] = {}
        self._followers: dict[str, Watcher] = {}  # the watcher each of those threads runs
        self._stopped: OrderedDict[str, None] = OrderedDict()
        self._starting: set[str] = set()
        self._outages = RuntimeOutages()
        self._lock = threading.Lock()

    @property
    def checkpoint_seconds(self) -> float:
        """Seconds between looks at a running job's checkpoint directory (`AgentConfig.checkpoint_seconds`)."""
        config = self._config or active_config() or config_from_settings()
        return config.checkpoint_seconds

    def report(self, message: Message) -> None:
        """Send one report to the controller, after the log batches and pull reports waiting before it."""
        self.outbox.flush()
        self.pulls.flush()
        self._send(message.TASK, **message.to_wire())

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
        if self._outages.begin(kind, node):
            threading.Thread(target=self._await_runtime, args=(kind, node), name=f"recover-{node}", daemon=True).start()

    def _await_runtime(self, kind: str, node: str) -> None:
        self._outages.wait_out(kind, node, self.runtime(kind, node))
        log.info("the %s runtime of %s answers again: asking for a reconcile", kind, node)
        self.report(Reconcile())

    def recovering(self, kind: str, node: str) -> bool:
        """Whether an outage of that runtime is being waited out now."""
        return self._outages.ongoing(kind, node)

    def ended_unheard(self, kind: str, node: str, finished_at: str | None) -> bool:
        """Whether a replica that ended at `finished_at` (RFC 3339) did so while its runtime could not be reached."""
        return self._outages.covers(kind, node, finished_at)

    # --- start ---------------------------------------------------------------

    def start(self, spec: ReplicaSpec) -> None:
        """Start (or adopt) the replica `spec` describes, report it, and watch it until it ends.

        A start of a replica this agent is already starting is a no-op (the
        controller re-sends starts it has no answer for; the first one reports).
        """
        ref = ReplicaRef.from_message(spec)
        if self._was_stopped(ref.name):
            self.report(ReplicaExited(**ref.ids(), exit_code=None, message="Stopped before it started."))
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

    def _start(self, ref: ReplicaRef, spec: ReplicaSpec) -> None:
        runtime = self.runtime(ref.runtime, ref.node)
        try:
            handle = runtime.start(driver_spec(spec), timeout=START_TIMEOUT, on_pull=self.pulls.listener(ref))
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
            self.report(ReplicaExited(**ref.ids(), exit_code=None, message=str(error), launch_failed=True))
            return
        self.watch_handle(
            ref,
            handle,
            log_cursor="",
            ready_path=spec.ready_path,
            secret=spec.secret,
            checkpoint_dir=spec.checkpoint_dir,
        )

    def watch(self, message: WatchReplica) -> None:
        """Watch a replica the controller believes runs (reconcile), resuming its output at `log_cursor`."""
        ref = ReplicaRef.from_message(message)
        if not message.handle:
            return
        self.watch_handle(
            ref,
            message.handle,
            log_cursor=message.log_cursor,
            ready_path=message.ready_path,
            secret=message.secret,
            report_start=message.report_start,
            resend=message.resend,
            checkpoint_dir=message.checkpoint_dir,
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
        checkpoint_dir: str = "",
    ) -> None:
        """Report the replica started and follow it on a thread of its own, unless one already does.

        A new watcher reports the start unless it is a `resend`; an existing
        one's replica is reported again when `report_start` says the
        controller has not heard of it (its first report was lost, e.g. with a
        restarted broker). The report is idempotent. With `resend` (the
        controller's stored output stops short of what was shipped: a batch
        was lost on the way), a new watcher reads the output again from
        `log_cursor`, running or ended, and the current one stops shipping.
        A `checkpoint_dir` (the node's path of a job's checkpoint directory)
        is looked at while the replica runs (`inventory.agent.checkpoints`).
        """
        with self._lock:
            current = self._watchers.get(ref.name)
            thread: threading.Thread | None = None
            if resend or current is None or not current.is_alive():
                previous = self._followers.get(ref.name)
                if previous is not None:
                    previous.superseded.set()
                watcher = Watcher(self, ref, handle, log_cursor, ready_path, secret, checkpoint_dir)
                thread = threading.Thread(target=watcher.run, name=f"watch-{ref.name}", daemon=True)
                self._watchers[ref.name] = thread
                self._followers[ref.name] = watcher
        if (thread is not None and not resend) or report_start:
            self.report(ReplicaStarted(**ref.ids(), handle=handle, endpoint=str(handle.get("endpoint") or "")))
        if thread is not None:
            thread.start()

    def forget(self, watcher: Watcher) -> None:
        """Drop `watcher`, which ended, unless a newer watcher of its replica took its place."""
        with self._lock:
            if self._followers.get(watcher.ref.name) is watcher:
                del self._followers[watcher.ref.name]
                self._watchers.pop(watcher.ref.name, None)

    # --- stop ------------------------------------------------------------------

    def stop(self, message: StopReplica) -> None:
        """Stop the replica (SIGTERM, grace, SIGKILL), remove it if asked, and report its exit.

        A stop that says the replica `ended` (the controller holds its exit
        and removes its leftovers) reports nothing: that report would be one
        more message on the controller's queue per workload, read and dropped.
        """
        ref = ReplicaRef.from_message(message)
        self._remember_stop(ref.name)
        runtime = self.runtime(ref.runtime, ref.node)
        owner = message.installation
        handle = message.handle or self._find(runtime, ref.name, owner=(owner, ref.node) if owner else None)
        report = not message.ended
        if not handle:
            if report:
                self.report(ReplicaExited(**ref.ids(), exit_code=None, message="It was not running on the node."))
            return
        status = runtime.stop(handle, grace_seconds=message.grace_seconds, timeout=CALL_TIMEOUT)
        watcher = self._watchers.get(ref.name)
        if watcher is not None and watcher.is_alive():
            watcher.join(timeout=10)  # lets the watcher ship the last lines and report the exit itself
        if report:
            self.report(ReplicaExited(**ref.ids(), exit_code=status.exit_code, message=status.message or "Stopped."))
        if message.remove and isinstance(runtime, RemovableRuntime):
            runtime.remove(handle, timeout=CALL_TIMEOUT)

    def _find_quietly(self, runtime: Runtime, name: str) -> Handle:
        """Return the handle of `name` on `runtime`, or {} when it is not there or the runtime cannot say."""
        try:
            return self._find(runtime, name)
        except DriverError:
            return {}

    def _find(self, runtime: Runtime, name: str, *, owner: tuple[str, str] | None = None) -> Handle:
        """Return the handle of `name`; with `owner` (installation, node), only of a workload that owner started.

        A same-named container of another console or node is not ours to stop.
        """
        for managed in runtime.list_managed(timeout=CALL_TIMEOUT):
            if managed.name == name and (owner is None or managed.owner(*owner) is Ownership.OWN):
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

    def inventory_report(
        self,
        *,
        node: str,
        runtime: str,
        confirmed: list[str],
        launched: list[str] | None = None,
        installation: str = "",
    ) -> dict[str, Any]:
        """Return the node's own view for reconcile (`jobs.node_replicas` arguments), taken now.

        `managed`: every replica the runtime has, in any state; `starting`:
        replicas this agent is starting right now; `gone`: those of
        `confirmed` (replicas the controller heard were started before it
        asked) that the runtime no longer has and this agent is not
        starting. Only `gone` ever makes the controller declare a replica
        vanished: a replica is never judged by how late a message arrives.
        `unstarted`: those of `launched` (replicas whose start the controller
        sent before it asked) that this agent is not starting, the only ones
        the controller sends again; given only when the controller named
        `launched` (older controllers did not). With `installation` (the
        asking console's id), `managed` holds only what that installation
        started for `node`, and those recording no owner (see `inventory`).
        """
        with self._lock:
            starting = sorted(self._starting)
        managed = self.inventory(node=node, runtime=runtime, installation=installation)
        present = {item["name"] for item in managed} | set(starting)
        gone = [name for name in confirmed if name not in present]
        report = {"node": node, "managed": managed, "starting": starting, "gone": gone}
        if launched is not None:
            report["unstarted"] = [name for name in launched if name not in starting]
        return report

    def inventory(self, *, node: str, runtime: str, installation: str = "") -> list[dict[str, Any]]:
        """Return the replicas the node's runtime manages, as JSON for `jobs.node_replicas`.

        With `installation`, a replica another installation or another node
        started (two nodes, or two consoles, on one engine) is left out: it
        is not this node's to report, watch or stop. One recording no owner
        (started before owners were recorded) is listed with empty
        `installation` and `node`, and the controller leaves it alone.
        """
        listed = self.runtime(runtime, node).list_managed(timeout=CALL_TIMEOUT)
        if installation:
            listed = [m for m in listed if m.owner(installation, node) is not Ownership.FOREIGN]
        return [
            {
                "name": m.name,
                "workload_id": m.workload_id,
                "attempt": m.attempt,
                "replica": m.replica,
                "state": m.state,
                "handle": m.handle,
                "installation": m.installation,
                "node": m.node,
            }
            for m in listed
        ]


_executor: Executor | None = None
_executor_lock = threading.Lock()


def executor() -> Executor:
    """Return this process's executor (one per process: the agent's, or the controller's for simulated nodes)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = Executor()
        return _executor


def install_executor(config: AgentConfig, send: Callable[..., None]) -> Executor:
    """Make this process's executor one for `config` whose reports go through `send`; return it.

    The remote agent's reports go to its spool, not to a broker it cannot reach.
    """
    global _executor
    with _executor_lock:
        _executor = Executor(config, send=send)
        return _executor
