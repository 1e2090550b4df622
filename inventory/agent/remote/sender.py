"""The remote agent's sender: posts the spool's head to the console, in order, and deletes what was taken.

One thread, one batch in flight: up to MAX_MESSAGES messages or
MAX_BATCH_BYTES from the head of the spool, plus the latest live samples.
It wakes as soon as something is spooled (a quiet node's exit report leaves
at once) and posts at most every SHIP_SECONDS while busy (a chatty node's
log batches leave together). A batch the console takes, or refuses for
good (malformed, or not this node's), leaves the spool; any other answer
keeps it, and the sender waits (`Backoff`) and tries the same head again,
so nothing is ever reordered or skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from common.protocol import messages as protocol
from inventory.agent.remote.backoff import Backoff
from inventory.agent.remote.client import Delivery, Reply
from inventory.agent.remote.spool import LIVE_KIND, LiveSamples, Spool, Spooled

log = logging.getLogger(__name__)

# The version of the live samples message this agent writes (the spool's `LiveSamples` is its holder).
SAMPLES_VERSION = protocol.LiveSamples.VERSION

SHIP_SECONDS = 0.1
MAX_MESSAGES = 500
MAX_BATCH_BYTES = 1024 * 1024
# A failing console is logged on the first failure of a streak, then on every LOG_EVERY-th.
LOG_EVERY = 10

Post = Callable[[list[dict[str, Any]]], Reply]


class Sender:
    """Ships `spool` (and `live` samples) through `post` until stopped; `send_once` is one round."""

    def __init__(
        self,
        spool: Spool,
        live: LiveSamples,
        post: Post,
        *,
        backoff: Backoff | None = None,
        ship_seconds: float = SHIP_SECONDS,
        max_messages: int = MAX_MESSAGES,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> None:
        self.spool, self.live, self.post = spool, live, post
        self.backoff = backoff or Backoff()
        self.ship_seconds, self.max_messages, self.max_batch_bytes = ship_seconds, max_messages, max_batch_bytes
        self.delivered = 0  # messages the console took
        self.rejected = 0  # messages dropped because the console refused their batch for good
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Say that something new waits (the spool's and the live samples' `on_put`)."""
        self._wake.set()

    def send_once(self) -> Reply | None:
        """Post one batch from the head; return the console's reply, or None when nothing waits."""
        batch = self.spool.head(max_messages=self.max_messages, max_bytes=self.max_batch_bytes)
        snapshot = self.live.take()
        if not batch and snapshot is None:
            return None
        messages = [item.message for item in batch]
        if snapshot is not None:
            messages.append({"kind": LIVE_KIND, "version": SAMPLES_VERSION, "samples": snapshot.samples})
        reply = self.post(messages)
        if reply.delivery is Delivery.DELIVERED:
            self._forget(batch)
            self.delivered += len(batch)
        elif reply.delivery is Delivery.REJECTED:
            log.error(
                "the console refused a batch of %d messages as malformed or not this node's (HTTP %s): %s; "
                "the batch is dropped",
                len(messages),
                reply.status,
                reply.detail,
            )
            self._forget(batch)
            self.rejected += len(batch)
        elif snapshot is not None:
            self.live.give_back(snapshot)
        return reply

    def run(self) -> None:
        """Send until `stop`: at once when woken, every SHIP_SECONDS while busy, after a back-off on failure."""
        while not self._stopped.is_set():
            self._wake.clear()  # before reading the spool: a put from now on wakes the wait below
            started = time.monotonic()
            reply = self.send_once()
            if reply is None:
                self._wake.wait()
                continue
            self._stopped.wait(self._pause(reply, started))

    def start(self) -> threading.Thread:
        """Run the loop on a daemon thread and return it."""
        self._thread = threading.Thread(target=self.run, name="agent-sender", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the loop to end after `stop`; return whether it did."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def flush(self, timeout: float) -> bool:
        """Stop the loop, then send what waits until none does, a try fails, or `timeout` passes.

        Return whether the spool is empty. What is left stays on disk and
        leaves after the next start.
        """
        deadline = time.monotonic() + timeout
        self.stop()
        if not self.join(timeout):
            return False  # still waiting on the console: sending the same head again here would duplicate it
        while time.monotonic() < deadline:
            reply = self.send_once()
            if reply is None:
                return True
            if reply.delivery not in (Delivery.DELIVERED, Delivery.REJECTED):
                return False
        return len(self.spool) == 0

    def _forget(self, batch: list[Spooled]) -> None:
        if batch:
            self.spool.delete_through(batch[-1].id)

    def _pause(self, reply: Reply, started: float) -> float:
        """Return the seconds to wait after `reply`: the rest of SHIP_SECONDS, or a back-off after a failure."""
        if reply.delivery in (Delivery.DELIVERED, Delivery.REJECTED):
            if self.backoff.failures:
                log.info("the console takes reports again after %d failed attempts", self.backoff.failures)
            self.backoff.reset()
            return max(0.0, self.ship_seconds - (time.monotonic() - started))
        unauthorized = reply.delivery is Delivery.UNAUTHORIZED
        delay = self.backoff.next_delay(unauthorized=unauthorized)
        if self.backoff.failures % LOG_EVERY == 1:
            what = "credential revoked or unknown: re-join" if unauthorized else "the console did not take reports"
            log.log(
                logging.ERROR if unauthorized else logging.WARNING,
                "%s (HTTP %s: %s); %d messages wait, retrying in %.1f s (attempt %d)",
                what,
                reply.status or "-",
                reply.detail,
                len(self.spool),
                delay,
                self.backoff.failures,
            )
        return delay
