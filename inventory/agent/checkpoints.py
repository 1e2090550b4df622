"""A running job's checkpoints, as its node sees them: the newest file in its checkpoint directory.

A job finds `GPUCLOUD_CHECKPOINT_DIR` in its environment; whatever it writes
there is its checkpoint. The node's agent looks at that directory on its own
disk (every backend a replica mounts is mounted on its node, a node-local
one included) every `AgentConfig.checkpoint_seconds` while the replica
runs, and reports each newer file time (`ReplicaCheckpointed`). The
controller keeps only a time newer than the one it has, so a report sent
twice, or again after the agent restarted, changes nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from common.protocol.messages import ReplicaCheckpointed
from common.protocol.wire import Message
from inventory.agent.replicas import ReplicaRef
from inventory.drivers.storage import newest_file_time

log = logging.getLogger(__name__)


def watch_checkpoints(
    report: Callable[[Message], None], ref: ReplicaRef, directory: str, *, every: float, done: threading.Event
) -> None:
    """Report each newer file time below `directory` (epoch seconds as `at`) until `done` is set; blocks.

    Looks once at the start (a resumed watch reports what was written while
    nobody looked), then every `every` seconds. A directory that is not there
    (nothing written yet) or cannot be read reports nothing.
    """
    last: float | None = None
    while True:
        newest = _newest(directory)
        if newest is not None and (last is None or newest > last):
            try:
                report(ReplicaCheckpointed(**ref.ids(), at=newest))
                last = newest
            except Exception:  # the broker is away: the next look reports it again
                log.warning("the checkpoint of %s could not be reported", ref.name, exc_info=True)
        if done.wait(every):
            return


def _newest(directory: str) -> float | None:
    try:
        return newest_file_time(directory)
    except OSError as error:
        log.info("checkpoint directory %s cannot be read: %s", directory, error)
        return None


def checkpoint_thread(executor: Any, ref: ReplicaRef, directory: str, done: threading.Event) -> threading.Thread:
    """Return a started daemon thread running `watch_checkpoints` for replica `ref` of `executor`'s node."""
    thread = threading.Thread(
        target=watch_checkpoints,
        args=(executor.report, ref, directory),
        kwargs={"every": executor.checkpoint_seconds, "done": done},
        name=f"checkpoints-{ref.name}",
        daemon=True,
    )
    thread.start()
    return thread
