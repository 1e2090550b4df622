"""The console's WebSocket streams (docs/live.md): logs, workload events, GPU metrics.

A stream's bookkeeping is a `Stream` without I/O: the URL to (re)connect to, what each message yields, and
when it is done. `iterate` (sync, `websockets.sync`) and `aiterate` (asyncio, `websockets.asyncio`) run
any stream the same way: connect with the token as a Bearer header and no Origin, reconnect after a drop
with `Reconnect`'s back-off (0.2 s doubling to 5 s, jittered), and stop for good on the close codes
4400/4401/4403/4404/4429, raising `StreamError` with the exit code of the matching HTTP status.

`LogFollow` is how `logs -f` neither loses nor repeats a line: it remembers the last `seq` yielded,
reconnects with `?after=<seq>`, drops any line at or below it, and once the state message says the workload
ended, the client drains `GET logs/?since=<seq>` until `complete`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode

from gpucloud_client import operations as ops
from gpucloud_client.config import Context
from gpucloud_client.errors import (
    EXIT_AUTH,
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    ClientError,
    ConnectionFailed,
)
from gpucloud_client.models import GpuBatch, LogLine, LogPage, WorkloadDetail, WorkloadRow
from gpucloud_client.transport import USER_AGENT, Call

T = TypeVar("T")

# Close codes after which reconnecting cannot help, with the exit code each gives.
STOP_CODES = {4400: EXIT_INVALID, 4401: EXIT_AUTH, 4403: EXIT_AUTH, 4404: EXIT_NOT_FOUND, 4429: EXIT_UNAVAILABLE}
STOP_STATUSES = {400: EXIT_INVALID, 401: EXIT_AUTH, 403: EXIT_AUTH, 404: EXIT_NOT_FOUND}


class StreamError(ClientError):
    """A stream the console closed for good (bad parameters, no access, not found, too many streams)."""


class Stream(Generic[T]):
    """Bookkeeping of one stream: `path` and `query()` to connect, `feed` per message, `done` to stop."""

    path: str = ""
    done: bool = False

    def query(self) -> dict[str, str]:
        """Return the query of the next connection (it may change as messages arrive)."""
        return {}

    def feed(self, message: dict[str, Any]) -> list[T]:
        """Return what one message yields (and update the bookkeeping)."""
        raise NotImplementedError

    def idle(self) -> list[T]:
        """Return what to yield when no message came for the runner's idle timeout."""
        return []


class LogFollow(Stream[LogLine]):
    """A workload's log, followed: no line lost or repeated across reconnections (see the module)."""

    def __init__(self, workload_id: int, *, after: int | None = None, tail: int | None = None) -> None:
        self.workload_id = int(workload_id)
        self.path = f"/ws/workloads/{self.workload_id}/logs/"
        self.last = after
        self.tail = tail
        self.state: str | None = None
        self.drained = False

    def query(self) -> dict[str, str]:
        if self.last is not None:
            return {"after": str(self.last)}
        return {"tail": str(self.tail)} if self.tail is not None else {}

    def feed(self, message: dict[str, Any]) -> list[LogLine]:
        if message.get("type") == "state":
            self.state = str(message.get("state") or "")
            self.done = self.done or bool(message.get("ended"))
            return []
        if message.get("type") != "lines":
            return []
        rows = message.get("lines") or []
        return self._fresh([LogLine.from_row(row) for row in rows if isinstance(row, list) and len(row) >= 6])

    def _fresh(self, lines: list[LogLine]) -> list[LogLine]:
        fresh = [line for line in lines if self.last is None or line.seq > self.last]
        if fresh:
            self.last = fresh[-1].seq
        return fresh

    def drain_call(self, tenant: str | None) -> Call[LogPage] | None:
        """Return the next `GET logs/?since=` page to read once the workload ended, or None when complete."""
        if not self.done or self.drained:
            return None
        return ops.logs(tenant, self.workload_id, since=self.last or 0, limit=ops.MAX_LOG_PAGE)

    def feed_page(self, page: LogPage) -> list[LogLine]:
        """Return the page's lines not yet yielded; after a `complete` page nothing is left to drain."""
        self.drained = page.complete or not page.lines
        return self._fresh(sorted(page.lines, key=lambda line: line.seq))


class EventsWatch(Stream[WorkloadRow]):
    """A tenant's (or one project's) workload rows: the snapshot's first, marked `snapshot=True`."""

    def __init__(self, tenant: str | None, project: str | None = None) -> None:
        self.path = events_path(tenant)
        self.project = project

    def query(self) -> dict[str, str]:
        return {"project": self.project} if self.project else {}

    def feed(self, message: dict[str, Any]) -> list[WorkloadRow]:
        if message.get("type") == "snapshot":
            rows = [WorkloadRow.from_json(row) for row in message.get("workloads") or [] if isinstance(row, dict)]
            for row in rows:
                row.snapshot = True
            return rows
        if message.get("type") == "workload":
            return [WorkloadRow.from_json({k: v for k, v in message.items() if k != "type"})]
        return []


def events_path(tenant: str | None) -> str:
    """Return the path of a tenant's events stream, `/ws/t/<tenant>/events/`."""
    return "/" + ops.tenant_path(tenant, "events/").replace("tenants/", "ws/t/", 1)


class WaitWatch(Stream[int]):
    """The events of one workload's project, reduced to "read the workload again" signals.

    Yields the workload id on every snapshot (a (re)connection may have missed a change), every row about
    the workload, and every `idle` timeout (pub/sub delivery is at most once).
    """

    def __init__(self, tenant: str | None, project: str | None, workload_id: int) -> None:
        self.path = events_path(tenant)
        self.project = project
        self.workload_id = int(workload_id)

    def query(self) -> dict[str, str]:
        return {"project": self.project} if self.project else {}

    def feed(self, message: dict[str, Any]) -> list[int]:
        if message.get("type") == "snapshot" or message.get("id") == self.workload_id:
            return [self.workload_id]
        return []

    def idle(self) -> list[int]:
        return [self.workload_id]


class MetricsWatch(Stream[GpuBatch]):
    """A workload's GPU samples: one `GpuBatch` per node about once a second."""

    def __init__(self, workload_id: int) -> None:
        self.path = f"/ws/workloads/{int(workload_id)}/metrics/"

    def feed(self, message: dict[str, Any]) -> list[GpuBatch]:
        if message.get("type") != "gpus":
            return []
        return [GpuBatch.from_json({k: v for k, v in message.items() if k != "type"})]


class WaitTracker:
    """What `wait` shares: calls `on_change` when a workload's visible state changed; says when to stop."""

    def __init__(self, on_change: Callable[[WorkloadDetail], None] | None = None) -> None:
        self.on_change = on_change
        self._seen: tuple[Any, ...] | None = None

    def update(self, detail: WorkloadDetail) -> bool:
        """Report `detail` to `on_change` if it differs from the last one seen; return whether it rests."""
        seen = (
            detail.state,
            detail.reason_code,
            detail.reason_message,
            detail.queue_position,
            tuple((step.key, step.status) for step in detail.launch_steps),
            detail.notebook_url,
            tuple((a.node, a.gpu_uuid, a.released_at) for a in detail.allocations),
        )
        if seen != self._seen:
            self._seen = seen
            if self.on_change is not None:
                self.on_change(detail)
        return detail.resting


class Reconnect:
    """Back-off between connection attempts; gives up after `max_failures` in a row without a message."""

    def __init__(self, base: float = 0.2, cap: float = 5.0, max_failures: int = 30) -> None:
        self.base, self.cap, self.max_failures = base, cap, max_failures
        self.failures = 0

    def received(self) -> None:
        """Note a message: the connection works, the next failure starts the back-off afresh."""
        self.failures = 0

    def delay(self, error: BaseException) -> float:
        """Return how long to wait before reconnecting after `error`; raises when reconnecting cannot help."""
        stop = permanent_error(error)
        if stop is not None:
            raise stop from error
        self.failures += 1
        if self.failures > self.max_failures:
            raise ConnectionFailed(f"the live stream keeps failing: {error or type(error).__name__}") from error
        return min(self.cap, self.base * 2.0 ** (self.failures - 1)) * (0.5 + random.random() / 2)  # noqa: S311


def permanent_error(error: BaseException) -> StreamError | None:
    """Return the StreamError of a close code or handshake status that forbids reconnecting, else None."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

    if isinstance(error, ConnectionClosed) and error.rcvd is not None and error.rcvd.code in STOP_CODES:
        reason = error.rcvd.reason or "closed"
        return StreamError(f"the live stream was closed: {reason}", exit_code=STOP_CODES[error.rcvd.code])
    if isinstance(error, InvalidStatus) and error.response.status_code in STOP_STATUSES:
        status = error.response.status_code
        return StreamError(f"the live stream was refused: HTTP {status}", exit_code=STOP_STATUSES[status])
    if isinstance(error, InvalidURI):
        return StreamError(f"not a WebSocket URL: {error.uri}")
    return None


def stream_uri(context: Context, stream: Stream[Any]) -> str:
    """Return the URL to connect `stream` to (the token is never in it: it travels as a header)."""
    query = stream.query()
    return f"{context.ws_url}{stream.path}" + (f"?{urlencode(query)}" if query else "")


def connect_options(context: Context, open_timeout: float) -> dict[str, Any]:
    """Return the keyword arguments of websockets' `connect`: the Bearer header, no Origin, timeouts."""
    return {
        "additional_headers": {"Authorization": f"Bearer {context.token}"},
        "user_agent_header": USER_AGENT,
        "open_timeout": open_timeout,
        "close_timeout": 2,
        # A log burst is many large messages; the default 1 MiB frame cap would drop the connection.
        "max_size": 64 * 2**20,
    }


def _message(raw: str | bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _retryable() -> tuple[type[BaseException], ...]:
    from websockets.exceptions import WebSocketException

    return (WebSocketException, OSError)  # OSError covers refused, reset, DNS and open timeouts


def iterate(
    context: Context,
    stream: Stream[T],
    *,
    open_timeout: float = 10.0,
    idle_timeout: float | None = None,
    reconnect: Reconnect | None = None,
) -> Generator[T, None, None]:
    """Yield what `stream` yields, reconnecting as the module says, until `stream.done`."""
    from websockets.sync.client import connect

    backoff = reconnect or Reconnect()
    retryable = _retryable()
    while not stream.done:
        try:
            with connect(stream_uri(context, stream), **connect_options(context, open_timeout)) as ws:
                while not stream.done:
                    try:
                        raw = ws.recv(timeout=idle_timeout)
                    except TimeoutError:
                        yield from stream.idle()
                        continue
                    backoff.received()
                    yield from stream.feed(_message(raw))
                return
        except retryable as error:
            wait = backoff.delay(error)
        time.sleep(wait)


async def aiterate(
    context: Context,
    stream: Stream[T],
    *,
    open_timeout: float = 10.0,
    idle_timeout: float | None = None,
    reconnect: Reconnect | None = None,
) -> AsyncGenerator[T, None]:
    """Asynchronously yield what `stream` yields, reconnecting as the module says, until `stream.done`."""
    from websockets.asyncio.client import connect

    backoff = reconnect or Reconnect()
    retryable = _retryable()
    while not stream.done:
        try:
            async with connect(stream_uri(context, stream), **connect_options(context, open_timeout)) as ws:
                while not stream.done:
                    try:
                        raw = await asyncio.wait_for(ws.recv(), idle_timeout)
                    except TimeoutError:
                        for item in stream.idle():
                            yield item
                        continue
                    backoff.received()
                    for item in stream.feed(_message(raw)):
                        yield item
                return
        except retryable as error:
            wait = backoff.delay(error)
        await asyncio.sleep(wait)
