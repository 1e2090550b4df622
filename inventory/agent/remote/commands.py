"""The remote agent's work: commands long-polled from the console, run on the agent's threads.

A command is `{"id", "task", "version", "args", "kwargs"}` naming one of
the agent's tasks (`inventory.agent.tasks`, the same functions the
co-located agent runs from its Celery queue, which decode their protocol
message), called in this process. A command whose `version` is not the one
this agent reads of its message (`common.protocol`) is logged and not run. A task that returns
a value (`agent.probe_node`'s report) has it spooled as a `result` message
for the console; a task's reports go through the executor, which the
remote agent points at the spool as well. The threads are daemons: a
start that takes minutes never holds up the agent's exit (the replica
keeps running, and the console's reconcile picks it up again).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from common.protocol import BY_TASK
from inventory.agent.remote.backoff import Backoff
from inventory.agent.remote.client import Delivery, Reply

log = logging.getLogger(__name__)

Handler = Callable[..., Any]
SpoolResult = Callable[[dict[str, Any]], None]


def agent_tasks() -> dict[str, Handler]:
    """Return the tasks a console may ask of an agent, by their task names (`agent.start_replica`, ...)."""
    from inventory.agent import tasks

    found = (tasks.probe_node, tasks.start_replica, tasks.stop_replica, tasks.watch_replica, tasks.list_replicas)
    return {task.name: task for task in found}


# Ids of commands already taken, so a command the console hands out again (its first answer was lost) runs once.
REMEMBERED_COMMANDS = 10_000


class CommandRunner:
    """Runs commands on `threads` daemon threads; results that are not None go to `spool_result` as messages.

    A command whose id was submitted before is dropped: the console delivers
    at least once (`CommandPoller` acknowledges what it received).
    """

    def __init__(self, handlers: Mapping[str, Handler], spool_result: SpoolResult, *, threads: int) -> None:
        self.handlers, self.spool_result = handlers, spool_result
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._work, name=f"agent-command-{index}", daemon=True) for index in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, command: dict[str, Any]) -> None:
        """Queue `command` for the next free thread, unless its id was seen already; returns at once."""
        command_id = str(command.get("id") or "")
        if command_id:
            if command_id in self._seen:
                log.info("command %s was delivered again: already taken", command_id)
                return
            self._seen[command_id] = None
            while len(self._seen) > REMEMBERED_COMMANDS:
                self._seen.popitem(last=False)
        self._queue.put(command)

    def run(self, command: dict[str, Any]) -> None:
        """Run one command here and now; an unknown task is logged and ignored, a failing one logged."""
        name = command.get("task")
        handler = self.handlers.get(str(name))
        if handler is None:
            log.warning("the console asked for an unknown task %r (command %s): ignored", name, command.get("id"))
            return
        version, reads = command.get("version"), BY_TASK[str(name)].VERSION if str(name) in BY_TASK else None
        if version is not None and version != reads:
            log.error(
                "command %s is %s version %r; this agent reads version %s: ignored",
                command.get("id"),
                name,
                version,
                reads,
            )
            return
        try:
            result = handler(*(command.get("args") or []), **(command.get("kwargs") or {}))
        except Exception:
            log.exception("command %s (%s) failed", command.get("id"), name)
            return
        if result is not None:
            self.spool_result({"kind": "result", "id": command.get("id"), "result": result})

    def _work(self) -> None:
        while True:
            self.run(self._queue.get())


class CommandPoller:
    """Long-polls the console (`poll(acks)`) for commands and hands each to `runner` until stopped.

    Each poll acknowledges the commands the previous one brought; the
    console hands out again whatever was given to a poll whose answer never
    arrived (a connection cut, an agent killed mid-poll).
    """

    def __init__(
        self, poll: Callable[[list[str]], Reply], runner: CommandRunner, *, backoff: Backoff | None = None
    ) -> None:
        self.poll, self.runner = poll, runner
        self.backoff = backoff or Backoff()
        self._acks: list[str] = []
        self._stopped = threading.Event()

    def poll_once(self) -> float:
        """Ask once and hand over what came; return the seconds to wait before asking again."""
        reply = self.poll(self._acks)
        if reply.delivery is Delivery.DELIVERED:
            self.backoff.reset()
            self._acks = [str(command["id"]) for command in reply.commands if command.get("id")]
            for command in reply.commands:
                self.runner.submit(command)
            return 0.0
        unauthorized = reply.delivery is Delivery.UNAUTHORIZED
        delay = self.backoff.next_delay(unauthorized=unauthorized)
        if self._stopped.is_set():
            pass  # the poll was cut short by the agent's exit: nothing to report
        elif unauthorized:
            log.error("credential revoked or unknown: re-join (retrying in %.1f s)", delay)
        elif self.backoff.failures == 1:
            log.warning("asking the console for commands failed (HTTP %s: %s)", reply.status or "-", reply.detail)
        return delay

    def run(self) -> None:
        while not self._stopped.is_set():
            self._stopped.wait(self.poll_once())

    def start(self) -> threading.Thread:
        """Poll on a daemon thread (a long poll may be cut short by the process's exit) and return it."""
        thread = threading.Thread(target=self.run, name="agent-commands", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stopped.set()
