"""Group commit: concurrent requests of an asyncio server handled in batches by worker threads.

Each request awaits `GroupCommit.run(item)`. A worker thread takes every
item queued at that moment (up to `max_weight` in all), hands the batch to
`handle`, and resolves each request with its own result. With `workers`
threads, a batch can be prepared while the one before it waits on the
database (the GIL allows no more); batches are taken in order of arrival,
one thread at a time, but may finish in any order. Nothing waits to
fill a batch: a lone request goes at once, and requests arriving while a
batch is being handled form the next one, so batches grow exactly as load
does. One database transaction per batch then serves many requests, which
is where the throughput comes from (`jobs.api.fast_ingest`).

`handle` runs on a worker thread, each thread with its own database
connection; it returns one result per item, in order. Should it raise,
every request of the batch gets that exception.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)

_Entry = tuple[T, asyncio.AbstractEventLoop, "asyncio.Future[R]"]


class GroupCommit(Generic[T, R]):
    """Batches items from any number of event loops (and threads) for one handler thread."""

    def __init__(
        self,
        handle: Callable[[list[T]], list[R]],
        *,
        name: str,
        max_weight: int,
        weight: Callable[[T], int] = lambda item: 1,
        workers: int = 1,
    ) -> None:
        self._handle = handle
        self._name = name
        self._max_weight = max_weight
        self._weight = weight
        self._queue: queue.SimpleQueue[_Entry[T, R]] = queue.SimpleQueue()
        self._held: _Entry[T, R] | None = None
        self._workers = workers
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._taking = threading.Lock()
        # Batches handled and the items in them, for benchmarks and tests.
        self.batches = 0
        self.items = 0

    async def run(self, item: T) -> R:
        """Return `handle`'s result for `item`, handled in the next batch; raise what `handle` raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._start()
        self._queue.put((item, loop, future))
        return await future

    def _start(self) -> None:
        if len(self._threads) == self._workers and all(t.is_alive() for t in self._threads):
            return
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            while len(self._threads) < self._workers:
                # Daemons: a batch cut off by the process exiting is a transaction the database rolls back.
                thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _next_batch(self) -> list[_Entry[T, R]]:
        """Block for one entry, then take what else is queued, up to the weight bound (at least one entry)."""
        with self._taking:  # one worker takes a batch at a time, so the held entry and the order stay whole
            batch = self._take()
            self.batches += 1
            self.items += len(batch)
            return batch

    def _take(self) -> list[_Entry[T, R]]:
        first = self._held if self._held is not None else self._queue.get()
        self._held = None
        batch = [first]
        total = self._weigh(first[0])
        while total < self._max_weight:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                break
            weight = self._weigh(entry[0])
            if total + weight > self._max_weight:
                self._held = entry  # first of the next batch, so the order of arrival holds
                break
            batch.append(entry)
            total += weight
        return batch

    def _weigh(self, item: T) -> int:
        """Return the item's weight; one that cannot be weighed goes in a batch of its own."""
        try:
            return self._weight(item)
        except Exception:
            log.exception("%s: could not weigh an item", self._name)
            return self._max_weight

    def _work(self) -> None:
        while True:
            batch = self._next_batch()
            try:
                results = self._handle([item for item, _, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"{self._name}: {len(results)} results for {len(batch)} items")
            except BaseException as error:  # every waiting request must hear of it, whatever it is
                log.exception("%s: a batch of %d failed", self._name, len(batch))
                for _, loop, future in batch:
                    _deliver(loop, _fail, future, error)
                continue
            for (_, loop, future), result in zip(batch, results, strict=True):
                _deliver(loop, _resolve, future, result)


def _deliver(
    loop: asyncio.AbstractEventLoop, how: Callable[..., None], future: asyncio.Future[R], value: object
) -> None:
    try:
        loop.call_soon_threadsafe(how, future, value)
    except RuntimeError:
        log.debug("a request's event loop closed before its answer; dropped")


def _resolve(future: asyncio.Future[R], result: R) -> None:
    if not future.done():  # the request may have been cancelled (its client went away)
        future.set_result(result)


def _fail(future: asyncio.Future[R], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
