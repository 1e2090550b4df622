"""Messages from the controller to the node agents and to itself, sent once the current transaction commits.

The ledger decides first; only a committed decision is acted on. A message
to an agent is a protocol message (`common.protocol.messages`: its class
names the agent's task, which the controller does not import, and encodes
its arguments; `send_message`) and goes to the node's own queue (`Node.agent_queue`: `node.<name>`, or `control` for
simulated nodes, whose runtime lives in the controller).

A message lost to a broker outage is not fatal: reconcile (`jobs.reconcile`)
re-sends what the ledger still expects, and every receiving task is
idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from celery import current_app as app
from django.db import transaction
from kombu.exceptions import OperationalError

from common.protocol.wire import Message
from common.task_names import LAUNCH_WORKLOADS

log = logging.getLogger(__name__)

LAUNCH_BATCH = 200


def send(task: str, *, queue: str, kwargs: dict[str, Any]) -> bool:
    """Send `task` to `queue` now; return False (logged) when the broker cannot be reached."""
    try:
        app.send_task(task, kwargs=kwargs, queue=queue)
    except (OperationalError, OSError):
        log.warning("could not send %s to %s; reconcile will retry", task, queue, exc_info=True)
        return False
    return True


def send_on_commit(task: str, *, queue: str, kwargs: dict[str, Any]) -> None:
    """Send `task` to `queue` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: send(task, queue=queue, kwargs=kwargs))


def send_message(message: Message, *, queue: str) -> bool:
    """Send the protocol `message` to `queue` now, as its task with its fields; False (logged) when the broker
    cannot be reached."""
    return send(message.TASK, queue=queue, kwargs=message.to_wire())


def message_on_commit(message: Message, *, queue: str) -> None:
    """Send the protocol `message` to `queue` once the current transaction commits (at once outside one)."""
    send_on_commit(message.TASK, queue=queue, kwargs=message.to_wire())


def launch_on_commit(workload_ids: Iterable[int]) -> None:
    """Ask the controller to launch the placed workloads `workload_ids` after commit, in batches."""
    ids = sorted(workload_ids)
    for start in range(0, len(ids), LAUNCH_BATCH):
        send_on_commit(LAUNCH_WORKLOADS, queue="control", kwargs={"workload_ids": ids[start : start + LAUNCH_BATCH]})
