"""Reading and following a container's output for the Docker runtime, resumable from a cursor.

Docker returns stdout and stderr as two streams of timestamped frames;
`ContainerLogs` merges them in time order, drops what the cursor already
covered (`timestamps.CursorFilter`) and bounds each read by the call's
budget, which the SDK does not (it turns the socket timeout off on log
streams).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from typing import Any

import docker

from inventory.drivers.base import DriverTimeout, LogLine, Stream
from inventory.drivers.docker._containers import Containers
from inventory.drivers.docker._engine import Budget, engine_errors
from inventory.drivers.timestamps import CursorFilter, parse_cursor, parse_ns

_FOLLOW_INTERVAL = 0.25


def _frames(chunks: Iterable[bytes], stream: Stream) -> Iterator[tuple[int, str, Stream, str]]:
    """Yield (ns, timestamp, stream, text) from log frames, one message each, prefixed with a timestamp."""
    for chunk in chunks:
        stamp, _, text = chunk.decode("utf-8", "replace").partition(" ")
        yield parse_ns(stamp), stamp, stream, text.removesuffix("\n")


def _close(streams: Iterable[Any]) -> None:
    for stream in streams:
        with suppress(Exception):
            stream.close()


class ContainerLogs:
    """The log reader of one runtime; `api` returns the thread's client with its timeout set to a budget's rest."""

    def __init__(self, api: Callable[[Budget], docker.APIClient], containers: Containers) -> None:
        self._api = api
        self._containers = containers

    def follow(self, container: str, since: str | None, follow: bool, budget: Budget, name: str) -> Iterator[LogLine]:
        """Yield the lines after cursor `since`; with `follow`, keep reading until the container exits.

        Raises DriverTimeout when `budget` runs out first (see `DockerRuntime.logs`).
        """
        with engine_errors(f"logs {name}"):
            while True:
                # Read the state before the logs: an exit seen here means the read below has every line.
                running = follow and self._running(container, budget)
                for line in self._read(container, since, budget):
                    since = line.cursor
                    yield line
                if not running:
                    return
                time.sleep(min(_FOLLOW_INTERVAL, budget.left()))

    def _running(self, container: str, budget: Budget) -> bool:
        attrs = self._api(budget).inspect_container(container)
        return self._containers.status(container, attrs, budget).state in ("created", "running")

    def _read(self, container: str, since: str | None, budget: Budget) -> Iterator[LogLine]:
        # Docker's `since` has whole-second precision here; the filter drops what the cursor already covered.
        seconds = parse_cursor(since)[0] // 1_000_000_000 if since else 0
        api = self._api(budget)
        streams = [
            api.logs(container, out, not out, stream=True, follow=False, timestamps=True, since=seconds or None)
            for out in (True, False)
        ]
        # The SDK turns the socket timeout off on log streams; a watchdog closes them when the budget runs out.
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            _close(streams)

        watchdog = threading.Timer(budget.left(), expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            lines = heapq.merge(_frames(streams[0], "stdout"), _frames(streams[1], "stderr"), key=lambda f: f[0])
            after = CursorFilter(since)
            for ns, stamp, stream, text in lines:
                cursor = after.accept(stamp, ns)
                if cursor is not None:
                    yield LogLine(timestamp=stamp, stream=stream, text=text, cursor=cursor)
        except Exception as error:
            if expired.is_set():
                raise DriverTimeout(f"reading logs took over {budget.timeout:g} s") from error
            raise
        finally:
            watchdog.cancel()
            _close(streams)
        if expired.is_set():
            raise DriverTimeout(f"reading logs took over {budget.timeout:g} s")
