"""The agent gateway: what a joined GPU host may say and hear, bound to the node its credential names.

A joined agent speaks HTTPS only (`jobs.api.agent`). It posts batches of
messages and long-polls for commands; this module is the rule for both:

- `check_messages` refuses a batch with anything malformed or not this
  node's own. Malformed (`Rejection.invalid`): a task outside the reports
  an agent makes, arguments that do not decode as that report's protocol
  message (`common.protocol`: types, ranges, known values, no unknown or
  missing keys; every bad field is named), a message `version` this
  console does not read. Not its own: a report on another node's replica,
  a heartbeat naming another node or carrying another node's GPU, a start
  whose endpoint is not on the node (`jobs.services.endpoints`), a result
  of a command sent elsewhere. Nothing of a refused batch is delivered.
- `deliver_messages` hands the rest to the same places the co-located
  agent uses: report tasks to the control or ingest queue, heartbeats to
  the mailbox, samples to the node's live group, probe results to the
  callback the controller linked. The node is always the credential's.
- `take_commands` pops the node's Celery queue (`node.<name>`) on the
  agent's behalf and turns each message into `{id, task, version, args,
  kwargs}` (`version`: of the command's protocol message).

Delivery is at least once both ways. A batch whose answer was lost is
sent again, and every report is idempotent (log batches are chained by
cursor). A command handed to a poll stays in the node's in-flight list
until the agent's next poll acknowledges it (`ack=id,...`); whatever that
poll does not acknowledge never arrived (the answer was cut, the agent was
killed mid-poll) and is handed out again at once. The agent runs each id
once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from celery import current_app as app
from celery import signature
from django.core.cache import cache
from django.db.models import Q

from common import doorbell
from common.control import VERSION_HEADER, queue_for
from common.protocol import BY_TASK, Message, ProtocolError
from common.protocol.messages import (
    COMMANDS,
    Heartbeat,
    LiveSamples,
    LogBatches,
    NodeReplicas,
    Reconcile,
    ReplicaCheckpointed,
    ReplicaExited,
    ReplicaPulling,
    ReplicaReady,
    ReplicaStarted,
)
from inventory.agent.reporter import node_gpu_group
from inventory.agent.transport import publish_samples
from inventory.mailbox import post_report
from inventory.models import Gpu, Node, agent_queue_for
from jobs.models import Replica
from jobs.services.endpoints import endpoint_problem

log = logging.getLogger(__name__)

REPLICA_TASKS = frozenset(
    message.TASK for message in (ReplicaStarted, ReplicaPulling, ReplicaReady, ReplicaExited, ReplicaCheckpointed)
)
LOG_TASK = LogBatches.TASK
NODE_TASK = NodeReplicas.TASK
FREE_TASKS = frozenset({Reconcile.TASK})
REPORT_TASKS = REPLICA_TASKS | FREE_TASKS | {LOG_TASK, NODE_TASK}
"""Every task an agent's reports may name; anything else is refused."""

COMMAND_TASKS = frozenset(message.TASK for message in COMMANDS)
"""What the controller sends a node's queue; anything else found there is dropped, not handed out."""

MESSAGE_KINDS = frozenset({"task", "heartbeat", "samples", "result"})
MAX_MESSAGES = 1000
MAX_COMMANDS = 50
# A command's linked callbacks wait here for its result; a probe is void after NODE_PROVISION_TIMEOUT anyway.
_COMMAND_KEY = "agent.command.{id}"
_COMMAND_SECONDS = 86400


@dataclass(frozen=True)
class Rejection:
    """One refused message: its index in the batch and the rule it broke.

    `invalid`: the message is malformed (not the node's fault of ownership);
    `fields` then names each bad field of its arguments and what is wrong.
    """

    index: int
    reason: str
    invalid: bool = False
    fields: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"index": self.index, "reason": self.reason}
        if self.fields:
            found["fields"] = dict(self.fields)
        return found


ReplicaKey = tuple[int, int, int]


def _replica_key(kwargs: dict[str, Any]) -> ReplicaKey | None:
    values = (kwargs.get("workload_id"), kwargs.get("attempt"), kwargs.get("replica"))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return None
    return (int(values[0]), int(values[1]), int(values[2]))  # type: ignore[arg-type]  # ints, checked above


def _invalid(index: int, reason: str, fields: dict[str, str] | None = None) -> Rejection:
    return Rejection(index, reason, invalid=True, fields=tuple((fields or {}).items()))


def _report_error(index: int, message: dict[str, Any]) -> Rejection | None:
    """Return why a task message does not decode as the protocol message of the report it names, or None."""
    task = message.get("task")
    if task not in REPORT_TASKS:
        return _invalid(index, f"task {task!r} is not a report an agent makes")
    return _decode_error(index, BY_TASK[str(task)], message.get("kwargs", {}), message.get("version"))


def _decode_error(index: int, kind: type[Message], data: Any, version: Any) -> Rejection | None:
    """Return why `data` (of the message's `version`, None: unstated) does not decode as `kind`, or None."""
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        return _invalid(index, "version must be an integer")
    try:
        kind.from_wire(data, version=version)
    except ProtocolError as error:
        return _invalid(index, f"{kind.TASK}: does not fit its protocol message", error.problems)
    return None


def _shape_error(index: int, message: Any) -> Rejection | None:
    """Return why `message` is not a well-formed message of a known kind, or None."""
    if not isinstance(message, dict):
        return _invalid(index, "a message is a JSON object")
    kind = message.get("kind")
    if kind not in MESSAGE_KINDS:
        return _invalid(index, f"kind must be one of {', '.join(sorted(MESSAGE_KINDS))}")
    if kind == "task":
        return _report_error(index, message)
    if kind == "heartbeat":
        return _decode_error(index, Heartbeat, message.get("report"), message.get("version"))
    if kind == "samples":
        return _decode_error(index, LiveSamples, {"samples": message.get("samples")}, message.get("version"))
    if kind == "result" and not isinstance(message.get("id"), str):
        return _invalid(index, "id must be the command's id")
    return None


def _replicas_named(index: int, message: dict[str, Any]) -> list[tuple[int, ReplicaKey | None]]:
    """Return (index, replica key) for every replica a task message reports on (None for a malformed one)."""
    task, kwargs = message["task"], message.get("kwargs", {})
    if task in REPLICA_TASKS:
        return [(index, _replica_key(kwargs))]
    if task == LOG_TASK:
        batches = kwargs.get("batches")
        if not isinstance(batches, list):
            return [(index, None)]
        return [(index, _replica_key(batch) if isinstance(batch, dict) else None) for batch in batches]
    return []


def _endpoint_problem(node: Node, message: dict[str, Any]) -> str | None:
    """Return why a start report's endpoint (argument or handle) is not on `node`, or None (`jobs.services.endpoints`).

    A joined node is never the console's local node: a loopback endpoint is refused too.
    """
    if message["task"] != ReplicaStarted.TASK:
        return None
    kwargs = message.get("kwargs", {})
    handle = kwargs.get("handle")
    reported = [kwargs.get("endpoint", ""), handle.get("endpoint", "") if isinstance(handle, dict) else ""]
    for endpoint in reported:
        if not isinstance(endpoint, str):
            return "not an http://HOST:PORT endpoint"
        problem = endpoint_problem(endpoint, node, local=False)
        if problem is not None:
            return problem
    return None


def _replicas_on_node(node: Node, keys: Iterable[ReplicaKey]) -> set[ReplicaKey]:
    """Return which of `keys` name replicas that ran or run on `node` (one query)."""
    wanted = set(keys)
    if not wanted:
        return set()
    match = Q()
    for workload_id, attempt, index in wanted:
        match |= Q(workload_id=workload_id, attempt=attempt, index=index)
    rows = Replica.all_tenants.filter(match, node=node).values_list("workload_id", "attempt", "index")
    return {(w, a, i) for w, a, i in rows}


def _uuids(report: dict[str, Any]) -> set[str]:
    found = {str(sample.get("uuid")) for sample in report.get("samples") or [] if isinstance(sample, dict)}
    history = report.get("history")
    return found | (set(map(str, history)) if isinstance(history, dict) else set())


def _foreign_gpus(node: Node, uuids: set[str]) -> set[str]:
    """Return the UUIDs among `uuids` that belong to GPUs of other nodes."""
    if not uuids:
        return set()
    return set(Gpu.objects.filter(uuid__in=uuids).exclude(node=node).values_list("uuid", flat=True))


def check_messages(node: Node, messages: list[Any]) -> list[Rejection]:
    """Return every message of the batch that `node` may not send, with the rule it broke; [] when all may go.

    When any message is malformed, only the malformed ones are returned (all `invalid`): what a message
    that does not decode claims is not judged.
    """
    if len(messages) > MAX_MESSAGES:
        return [_invalid(MAX_MESSAGES, f"a batch holds at most {MAX_MESSAGES} messages")]
    malformed = [error for index, message in enumerate(messages) if (error := _shape_error(index, message))]
    if malformed:
        return malformed
    rejections: list[Rejection] = []
    named: list[tuple[int, ReplicaKey | None]] = []
    uuids_by_index: dict[int, set[str]] = {}
    for index, message in enumerate(messages):
        kind = message["kind"]
        if kind == "task":
            named.extend(_replicas_named(index, message))
            problem = _endpoint_problem(node, message)
            if problem is not None:
                log.warning("node %s reported an endpoint the proxy may not use: %s", node.name, problem)
                rejections.append(Rejection(index, f"endpoint refused: {problem}"))
            if message["task"] == NODE_TASK and message["kwargs"].get("node") != node.name:
                rejections.append(Rejection(index, f"a node reports only its own replicas (node {node.name})"))
        elif kind == "heartbeat":
            if message["report"].get("node", node.name) != node.name:
                rejections.append(Rejection(index, f"a heartbeat names its own node ({node.name})"))
            uuids_by_index[index] = _uuids(message["report"])
        elif kind == "samples":
            uuids_by_index[index] = {str(s.get("uuid")) for s in message["samples"] if isinstance(s, dict)}
        elif kind == "result":
            sent_to = (cache.get(_COMMAND_KEY.format(id=message["id"])) or {}).get("node")
            if sent_to is not None and sent_to != node.name:
                rejections.append(Rejection(index, "a result answers a command sent to this node"))
    ours = _replicas_on_node(node, [key for _, key in named if key is not None])
    for index, key in named:
        if key is None:
            rejections.append(Rejection(index, "workload_id, attempt and replica must be integers"))
        elif key not in ours:
            rejections.append(Rejection(index, f"replica {key[0]}/{key[1]}/{key[2]} does not run on {node.name}"))
    foreign = _foreign_gpus(node, set().union(*uuids_by_index.values()) if uuids_by_index else set())
    for index, uuids in uuids_by_index.items():
        if uuids & foreign:
            rejections.append(Rejection(index, f"GPU {sorted(uuids & foreign)[0]} belongs to another node"))
    return sorted(set(rejections), key=lambda r: r.index)


def deliver_messages(node: Node, messages: list[dict[str, Any]]) -> int:
    """Hand every message (checked by `check_messages`) on, in order; return how many. Raises what the broker raises."""
    for message in messages:
        kind = message["kind"]
        if kind == "task":
            task, version = message["task"], message.get("version")
            headers = {VERSION_HEADER: version} if version is not None else None  # the version it was read as
            app.send_task(task, kwargs=message.get("kwargs", {}), queue=queue_for(task), headers=headers)
        elif kind == "heartbeat":
            post_report({**message["report"], "node": node.name})
        elif kind == "samples":
            publish_samples(node_gpu_group(node.name), message["samples"])
        elif kind == "result":
            _answer(node, message["id"], message.get("result"))
    return len(messages)


def _answer(node: Node, command_id: str, result: Any) -> None:
    """Run the callbacks the controller linked to command `command_id` with its result (once)."""
    key = _COMMAND_KEY.format(id=command_id)
    pending = cache.get(key)
    if not pending or pending.get("node") != node.name:
        log.info("result of command %s from %s: no callback waits for it", command_id, node.name)
        return
    cache.delete(key)
    for callback in pending.get("callbacks") or []:
        signature(callback, app=app).apply_async((result,))


def _expired(headers: dict[str, Any]) -> bool:
    expires = headers.get("expires")
    if not expires:
        return False
    try:
        return datetime.fromisoformat(str(expires)) <= datetime.now(UTC)
    except ValueError:
        return False


def _command(node: Node, headers: dict[str, Any], payload: Any) -> dict[str, Any] | None:
    """Return the command a Celery message on the node's queue carries, or None for one not to hand out."""
    task = headers.get("task")
    if task not in BY_TASK or task not in COMMAND_TASKS or not isinstance(payload, list | tuple) or len(payload) != 3:
        log.warning("dropping message %r on %s's queue: not an agent command", task, node.name)
        return None
    if _expired(headers):
        return None
    args, kwargs, embed = payload
    command_id = str(headers.get("id") or "")
    callbacks = (embed or {}).get("callbacks") or []
    if callbacks:
        cache.set(_COMMAND_KEY.format(id=command_id), {"node": node.name, "callbacks": callbacks}, _COMMAND_SECONDS)
    return {
        "id": command_id,
        "task": task,
        "version": headers.get(VERSION_HEADER, BY_TASK[task].VERSION),  # as its sender stamped it
        "args": list(args or []),
        "kwargs": dict(kwargs or {}),
    }


_INFLIGHT_KEY = "agent.inflight.{node}"


def _unexpired(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in entries if not _expired({"expires": entry.get("expires")})]


def take_commands(
    node: Node,
    *,
    wait: float,
    still_allowed: Callable[[], bool],
    acked: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """Return the node's commands: those handed out before and not in `acked` first, then new ones.

    New ones are taken from the node's queue, up to MAX_COMMANDS; when there
    are none and nothing is to be handed out again, it waits up to `wait`
    seconds on the node's doorbell (`common.doorbell`, rung whenever a
    command is published to the node's queue, and by a revocation), which
    costs this process nothing while it lasts. A credential cut off meanwhile
    gets nothing: what was taken stays in flight for the node's next,
    legitimate poll. Every command returned stays in flight until a later
    call acknowledges it.
    """
    key = _INFLIGHT_KEY.format(node=node.name)
    done = set(acked)
    again = _unexpired([entry for entry in cache.get(key) or [] if entry["command"]["id"] not in done])
    bell = agent_queue_for(node.name)
    fresh: list[dict[str, Any]] = []
    if not again:
        doorbell.silence(bell)  # before looking: a command published after the look rings again
        fresh = _take_from_queue(node, limit=MAX_COMMANDS)
        if not fresh and doorbell.wait(bell, wait) and still_allowed():
            fresh = _take_from_queue(node, limit=MAX_COMMANDS)
    # Read again just before writing: a poll cut off meanwhile (its client gone) may have added some.
    stored = cache.get(key) or []
    known = {entry["command"]["id"] for entry in again + fresh}
    inflight = again + fresh + [e for e in stored if e["command"]["id"] not in known | done]
    if inflight != stored:  # most polls find nothing and owe nothing: no write
        cache.set(key, inflight, _COMMAND_SECONDS)
    if not still_allowed():
        return []
    return [entry["command"] for entry in again + fresh]


def _take_from_queue(node: Node, *, limit: int) -> list[dict[str, Any]]:
    """Take up to `limit` commands waiting on the node's queue now, as in-flight entries; never waits."""
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(agent_queue_for(node.name), serializer="json")
        try:
            taken: list[dict[str, Any]] = []
            while len(taken) < limit:
                try:
                    message = queue.get_nowait()
                except queue.Empty:
                    break
                headers = dict(message.headers or {})
                command = _command(node, headers, message.payload)
                message.ack()
                if command is not None:
                    taken.append({"command": command, "expires": headers.get("expires")})
            return taken
        finally:
            queue.close()


def ring_for_published(routing_key: str | None) -> None:
    """Ring the doorbell of the node whose queue a message was just published to (`after_task_publish`)."""
    if routing_key and routing_key.startswith("node."):
        try:
            doorbell.ring(routing_key)
        except Exception:
            # The poll waiting there still ends by its own wait and takes the command then.
            log.warning("could not ring %s", routing_key, exc_info=True)
