"""The "live" channel layer's process-side plumbing: an in-memory layer threads may publish to, and the sender.

Live streams (log lines, GPU samples, workload events, access changes)
are published from synchronous code: Celery tasks, services called by
views, the agent's sampling thread. `publish` hands the messages to one
daemon thread per process that owns an event loop and sends them through
the "live" layer in order. The caller never waits on Redis and never sees
its errors: a channel-layer outage costs live updates (the streams' readers
catch up from the database), never a log ingest or a state change.

`async_to_sync(layer.group_send)` per call would start an event loop and
open a Redis connection each time; the sender keeps one of each.

Embedded mode has no Redis: `InProcessChannelLayer` is Channels' in-memory
layer, whose queues belong to the event loop that serves the consumers.
A send from any other loop (the sender's thread) is handed over to that
loop instead of touching its queues from a foreign thread, which would
neither be thread-safe nor wake the loop up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer

log = logging.getLogger(__name__)

LIVE_ALIAS = "live"
# Batches of messages waiting for the sender; past this the newest are dropped (Redis is down or slow).
QUEUE_CAPACITY = 10_000
# Seconds one group_send may take before the sender gives up on that message.
SEND_TIMEOUT = 2.0
# Seconds between two warnings about failed sends, so an outage does not flood the log.
WARN_EVERY = 30.0

Outgoing = tuple[str, dict[str, Any]]
"""A message for the live layer: (group name, message with its "type")."""


def access_group(user_id: int) -> str:
    """Return the group that hears when `user_id`'s access may have changed (`access.changed` messages).

    Every open connection of the user joins it: the live streams and the
    notebook proxy's WebSocket leg, which re-check their access on each message.
    """
    return f"access.user.{user_id}"


class InProcessChannelLayer(InMemoryChannelLayer):
    """Channels' in-memory layer, safe to send to from any thread's event loop.

    The loop that receives (the web server's, or a test's) is the layer's
    home: sends arriving on another loop run there instead.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._home: asyncio.AbstractEventLoop | None = None

    async def receive(self, channel: str) -> dict[str, Any]:
        self._home = asyncio.get_running_loop()
        return await super().receive(channel)

    async def group_add(self, group: str, channel: str) -> None:
        self._home = asyncio.get_running_loop()
        await super().group_add(group, channel)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        await self._at_home(lambda: super(InProcessChannelLayer, self).send(channel, message))

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await self._at_home(lambda: super(InProcessChannelLayer, self).group_send(group, message))

    async def _at_home(self, call: Callable[[], Coroutine[Any, Any, None]]) -> None:
        home, here = self._home, asyncio.get_running_loop()
        if home is None or home is here or home.is_closed() or not home.is_running():
            await call()
            return
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), home))


class _Sender:
    """A daemon thread with its own event loop that sends batches of live messages in the order given."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Sequence[Outgoing]] | None = None
        self._warned_at = 0.0

    def submit(self, messages: Sequence[Outgoing]) -> None:
        loop = self._running_loop()
        try:
            loop.call_soon_threadsafe(self._enqueue, messages)
        except RuntimeError:  # the loop closed: the process is exiting
            log.debug("live sender stopped; %d messages dropped", len(messages))

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            # A forked worker inherits the attributes but not the thread: start its own.
            if self._loop is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._loop = asyncio.new_event_loop()
                self._queue = asyncio.Queue(maxsize=QUEUE_CAPACITY)
                threading.Thread(target=self._run, args=(self._loop,), name="live-sender", daemon=True).start()
            return self._loop

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._drain())

    def _enqueue(self, messages: Sequence[Outgoing]) -> None:
        assert self._queue is not None
        try:
            self._queue.put_nowait(messages)
        except asyncio.QueueFull:
            self._warn(f"{len(messages)} live messages dropped: the sender is {QUEUE_CAPACITY} batches behind")

    async def _drain(self) -> None:
        assert self._queue is not None
        while True:
            messages = await self._queue.get()
            layer = get_channel_layer(LIVE_ALIAS)
            if layer is None:
                continue
            for group, message in messages:
                try:
                    await asyncio.wait_for(layer.group_send(group, message), SEND_TIMEOUT)
                except Exception as error:  # any layer failure is logged, never raised
                    self._warn(f"live message to {group} not sent: {error!r}")

    def _warn(self, text: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY:
            self._warned_at = now
            log.warning("%s (further failures within %.0f s are not logged)", text, WARN_EVERY)


_sender = _Sender()


def publish(messages: Sequence[Outgoing]) -> None:
    """Send `messages` to their groups on the live layer, in order, from the sender thread; never raises or blocks."""
    if messages:
        try:
            _sender.submit(list(messages))
        except Exception:
            log.exception("live messages could not be queued")
