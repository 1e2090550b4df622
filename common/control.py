"""Control work that coalesces, and the queues that keep it apart from bulk work.

Periodic and triggered control work (scheduling passes, heartbeat
application, reconcile, node checks, time limits, idle checks) looks at the
whole ledger each time it runs, so asking for it again while a run is
already waiting in the broker asks for nothing new. A coalescing task
therefore has at most one message waiting, whoever asks (beat, a
submission, a completion) and however far the workers fall behind:

- `request(name)` (and the task's own `apply_async`, which beat uses) sends
  the message only when it sets the task's marker in the shared cache;
  while the marker is set the request merges into the waiting message;
- a worker clears the marker just before it runs the task, so a request
  that arrives during a run queues exactly one follow-up and none is lost.

Every worker clears all markers whenever its consumer (re)connects to the
broker (`RecoverOnConnect`): a message waiting when a worker was killed may
be held unacknowledged by the broker for a long time, and one sent while a
restarted Redis had forgotten its queue bindings went nowhere; the
controller must not wait for either (an extra message costs one extra run).
As a last resort a marker expires after MARKER_SECONDS.
When the cache cannot be reached the message is sent anyway: a duplicate
run is harmless (every control task is idempotent), a lost one is not.

Bulk work (log ingest) travels on a queue of its own, INGEST_QUEUE, served
by its own worker threads, so a chatty workload's output never waits in
front of a scheduling pass or a replica's exit report.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import Any, TypeVar

from celery import Task, bootsteps, current_task
from celery import current_app as app
from django.core.cache import cache
from django.db import InterfaceError, OperationalError
from django.utils import timezone

from common.protocol.messages import ALL, LogBatches
from common.protocol.wire import Message
from common.task_names import INGEST_LOGS

log = logging.getLogger(__name__)

CONTROL_QUEUE = "control"
INGEST_QUEUE = "ingest"
# Tasks that carry bulk data (a node's log batches) and the queue they travel on.
INGEST_TASKS = frozenset({INGEST_LOGS, LogBatches.TASK})
MARKER_SECONDS = 60
_MARKER = "control:queued:{name}"


# Reports and launches carry what happened on a node: one that meets the database down (a restart, a
# failover) is retried with backoff for about five minutes instead of being dropped. Each is idempotent.
REPORT_RETRY: dict[str, Any] = {
    "autoretry_for": (OperationalError, InterfaceError),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": 15,
}

# When this process began watching: a silence or a wait it did not see from its start is not its to judge.
_WATCHING_SINCE = time.monotonic()
_STARTED_AT = time.time()

# The header every task message carries with the epoch seconds it was published at (`stamp_sent_at`).
SENT_AT_HEADER = "gpucloud_sent_at"


def watching_for(seconds: float) -> bool:
    """Return whether this process has been running for at least `seconds`.

    Judgements that count elapsed time (a node silent for the heartbeat
    timeout, a launch past the start timeout) are made only by a process that
    watched the whole of that time: after a restart of the controller (or of
    the whole embedded console) the node's first heartbeat and the relaunch
    of placed work get their full time, instead of being failed for the
    minutes the controller itself was down.
    """
    return time.monotonic() - _WATCHING_SINCE >= seconds


def watching_since() -> datetime:
    """Return when this process began watching (wall clock): what started before it, it did not see."""
    return datetime.fromtimestamp(_STARTED_AT, tz=UTC)


def stamp_sent_at(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Celery's `before_task_publish`: write the moment of publishing into the message's headers."""
    if headers is not None:
        headers[SENT_AT_HEADER] = time.time()


# The header a protocol message's task carries with the version of its shape (`stamp_protocol_version`), as
# the gateway's envelope carries it in `version`: one place per transport, read by `decode`.
VERSION_HEADER = "gpucloud_protocol_version"
_M = TypeVar("_M", bound=Message)


def stamp_protocol_version(sender: str | None = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Celery's `before_task_publish`: a protocol message's task says the version this side writes, unless the
    publisher named one (the gateway forwards a joined host's own)."""
    kind = ALL.get(str(sender))
    if headers is not None and kind is not None:
        headers.setdefault(VERSION_HEADER, kind.VERSION)


def protocol_version() -> Any:
    """Return the protocol version the running task's message names (`VERSION_HEADER`), or None: none named
    (a publisher that does not stamp, or a task called in process)."""
    request = getattr(current_task, "request", None)
    found = getattr(request, VERSION_HEADER, None)
    if found is None:  # `Task.apply` (eager) keeps custom headers apart
        found = (getattr(request, "headers", None) or {}).get(VERSION_HEADER)
    return found


def decode(kind: type[_M], message: dict[str, Any]) -> _M:
    """Return the running task's keyword arguments `message` as the protocol message `kind`, checked against
    the version its Celery message names; raises ProtocolError naming every field that does not fit (the task
    fails and does nothing, as the agent's tasks do with a command that does not fit)."""
    return kind.from_wire(message, version=protocol_version())


def evidence_time() -> datetime:
    """Return the moment up to which the running control task has seen every report sent before it.

    Reports and the tasks that judge them (start timeouts, lost nodes,
    relaunches) travel on the one FIFO `control` queue, so when a judging
    task runs, every report published before it was published has been
    taken: the evidence is complete up to its publish time, not up to now.
    A controller that fell behind therefore judges an older moment instead
    of mistaking its own backlog for silence, and judges nothing wrongly
    however deep the queue grows. Outside a task, or for a message from a
    publisher that does not stamp (an older agent), it is now.
    """
    now = timezone.now()
    request = getattr(current_task, "request", None)
    sent = getattr(request, SENT_AT_HEADER, None)
    if not isinstance(sent, int | float) or isinstance(sent, bool):
        return now
    return min(now, datetime.fromtimestamp(sent, tz=UTC))


def queue_for(task: str) -> str:
    """Return the queue a report or request named `task` travels on: ingest for bulk data, else control."""
    return INGEST_QUEUE if task in INGEST_TASKS else CONTROL_QUEUE


def _claim(name: str) -> bool:
    """Set `name`'s marker; return whether this caller set it (and must send the message)."""
    try:
        return bool(cache.add(_MARKER.format(name=name), 1, timeout=MARKER_SECONDS))
    except Exception:
        log.warning("coalescing marker of %s unavailable; sending anyway", name, exc_info=True)
        return True


def _release(name: str) -> None:
    """Clear `name`'s marker: the waiting message is being run (or was never sent)."""
    try:
        cache.delete(_MARKER.format(name=name))
    except Exception:
        log.warning("could not clear the coalescing marker of %s", name, exc_info=True)


def request(name: str, *, queue: str = CONTROL_QUEUE) -> bool:
    """Ask for one run of the coalescing task `name`; return whether a message was sent (False: merged).

    Raises what the broker raises when it cannot be reached (the marker is
    cleared first, so the next request tries again).
    """
    if not _claim(name):
        return False
    try:
        app.send_task(name, queue=queue)
    except Exception:
        _release(name)
        raise
    return True


def queued(name: str) -> bool:
    """Return whether a message of the coalescing task `name` is waiting (its marker is set)."""
    return cache.get(_MARKER.format(name=name)) is not None


class CoalescingTask(Task):
    """Base of coalescing tasks: at most one waiting message each (see the module docstring).

    Their results are never kept: with a result backend, sending a task that
    keeps its result also subscribes to it there, and after a Redis restart
    that subscription blocked the sender (beat) for the backend's 120 s
    socket timeout, so no pass was asked for meanwhile.
    """

    ignore_result = True

    def apply_async(  # type: ignore[override]  # None when the request merged into a waiting message
        self, args: Any = None, kwargs: Any = None, **options: Any
    ) -> Any:
        """Send the task unless a message of it is already waiting; return None when the request merged."""
        if not _claim(self.name):
            return None
        try:
            return super().apply_async(args, kwargs, **options)
        except Exception:
            _release(self.name)
            raise

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        """Clear the marker as the run begins, so a request made during the run queues one follow-up."""
        _release(self.name)


def forget_waiting(**_: Any) -> int:
    """Clear the marker of every coalescing task (a worker starting); return how many tasks there are.

    Run when a worker's consumer (re)connects (`RecoverOnConnect`): the next
    request of each task is sent, whatever was lost before.
    """
    names = [name for name, task in app.tasks.items() if isinstance(task, CoalescingTask)]
    for name in names:
        _release(name)
    return len(names)


def restore_unacknowledged(**_: Any) -> int:
    """Put back on their queues the messages workers took and never acknowledged; return how many.

    Run when the consumer of a worker serving `control` or `ingest` (re)connects:
    a worker killed with messages in hand (reports, log batches) leaves them
    unacknowledged in Redis, where the broker would give them back only after
    its visibility timeout; the restarted controller takes them at once.
    Only messages of the queues this worker serves are put back: the broker
    keeps one unacknowledged set for every queue, and an agent's messages
    in hand (a start it is carrying out) are that agent's to finish. A
    message another live controller worker is still running is delivered
    twice, which every task here allows (they are idempotent; a log batch
    stored already is recognised by its chain). Only Redis keeps such
    messages; embedded, they died with the process.
    """
    sender = _.get("sender")
    queues = {q.name for q in getattr(getattr(sender, "task_consumer", None), "queues", []) or []}
    if not app.conf.broker_url.startswith("redis") or not queues & {CONTROL_QUEUE, INGEST_QUEUE}:
        return 0
    restored = 0
    with app.connection_for_write() as connection:
        channel: Any = connection.default_channel
        with channel.conn_or_acquire() as client:
            for tag in client.zrange(channel.unacked_index_key, 0, -1):
                if _routing_key(client.hget(channel.unacked_key, tag)) in queues:
                    channel.qos.restore_by_tag(tag, client)
                    restored += 1
    if restored:
        log.warning("restored %d messages a stopped worker had taken and not acknowledged", restored)
    return restored


def _routing_key(stored: bytes | None) -> str | None:
    """Return the queue (routing key) of an unacknowledged message as kombu's Redis transport stores it."""
    if not stored:
        return None
    try:
        _message, _exchange, routing_key = json.loads(stored)
    except (ValueError, TypeError):
        return None
    return str(routing_key)


class RecoverOnConnect(bootsteps.StartStopStep):
    """Each time a worker's consumer (re)connects to the broker: clear the markers, restore held messages.

    A consumer starts when its worker starts and again after every broker
    reconnection. Both are moments when a waiting message may have been lost:
    a killed worker's is held unacknowledged, and a Redis restarted without
    persistence forgot its queues' bindings, so a message sent before the
    worker declared them again went nowhere while its marker stayed set.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent: Any) -> None:
        forget_waiting()
        restore_unacknowledged(sender=parent)


# How often a worker's event loop wakes, at least, to send what finished tasks acknowledged.
ACK_WAKE_SECONDS = 0.05


class PromptAcks(bootsteps.StartStopStep):
    """Wake the worker's event loop every ACK_WAKE_SECONDS, so a finished task's acknowledgement leaves at once.

    With late acknowledgements on the Redis transport, a task run by a pool
    thread hands its ack to the event loop (`hub.call_soon`), which nothing
    wakes: it waits in `poll` until the next timer, seconds away (celery
    issues 4378, 7718). The worker holds its prefetch until then, so an
    agent (threads) ran at most its thread count of tasks per timer tick, and
    a test worker with no heartbeat stopped after two. A repeated no-op
    timer bounds that wait; the distributed agent and test workers use it,
    prefork workers (woken by their result pipes) and the in-process
    transport (no event loop) are unaffected.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.timer: Any = None

    def start(self, parent: Any) -> None:
        hub = getattr(parent, "hub", None)
        if hub is not None and self.timer is None:
            self.timer = hub.call_repeatedly(ACK_WAKE_SECONDS, _wake)

    def stop(self, parent: Any) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    shutdown = stop


def _wake() -> None:
    """Nothing: the loop's waking up is the point (it then runs the acknowledgements handed to it)."""


def queue_depths(queues: tuple[str, ...] = (CONTROL_QUEUE, INGEST_QUEUE)) -> dict[str, int]:
    """Return how many task messages wait in each of `queues` (-1 where the broker cannot be read).

    Waiting means in the broker, or taken by a worker of this process and
    not started yet (an embedded worker takes every waiting message at once).
    """
    depths: dict[str, int] = {}
    try:
        with app.connection_for_read() as connection:
            channel: Any = connection.default_channel  # kombu's virtual channels declare queues
            for name in queues:
                try:
                    depths[name] = int(channel.queue_declare(queue=name, passive=True).message_count)
                except Exception:  # a queue nobody declared yet holds nothing
                    depths[name] = 0
    except Exception:  # the broker is down: say so rather than fail the caller
        log.warning("could not read the broker's queue depths", exc_info=True)
        return dict.fromkeys(queues, -1)
    for name, taken in _taken_not_started().items():
        if name in depths:
            depths[name] += taken
    return depths


def _taken_not_started() -> dict[str, int]:
    """Return {queue: messages this process's workers hold and have not started}."""
    from celery.worker import state

    counts: dict[str, int] = {}
    for request in list(state.reserved_requests - state.active_requests):
        queue = str((request.delivery_info or {}).get("routing_key") or "")
        counts[queue] = counts.get(queue, 0) + 1
    return counts
