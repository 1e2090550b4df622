"""Streams: the log-resume bookkeeping, message parsing, and reconnecting through injected drops.

The WebSocket server here only injects failures (a dropped connection, a refusing close code); the real
console's streams are exercised by the integration tests in the server repository (tests/client/).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosedError
from websockets.frames import Close
from websockets.sync.server import ServerConnection, serve

from gpucloud_client.aclient import AsyncClient
from gpucloud_client.client import Client
from gpucloud_client.config import Context
from gpucloud_client.errors import EXIT_AUTH, EXIT_NOT_FOUND, ConnectionFailed
from gpucloud_client.models import LogPage, WorkloadDetail
from gpucloud_client.streams import (
    EventsWatch,
    LogFollow,
    MetricsWatch,
    Reconnect,
    StreamError,
    WaitTracker,
    WaitWatch,
    permanent_error,
)

TOKEN = "gpc_0123456789ab_abcdefghijklmnopqrstuvwxyz012345"


def _row(seq: int) -> list[Any]:
    return [seq, "2026-01-01T00:00:00Z", "stdout", f"line {seq}", 1, 0]


def _lines(*seqs: int, snapshot: bool = False) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "lines", "lines": [_row(s) for s in seqs]}
    return {**message, "snapshot": True} if snapshot else message


def test_log_follow_drops_repeats_and_resumes_after_the_last_line() -> None:
    follow = LogFollow(7, tail=50)
    assert follow.query() == {"tail": "50"}

    assert [line.seq for line in follow.feed(_lines(1, 2, 3, snapshot=True))] == [1, 2, 3]
    assert follow.query() == {"after": "3"}
    assert [line.seq for line in follow.feed(_lines(2, 3, 4))] == [4]
    assert follow.feed({"type": "state", "state": "running", "ended": False}) == []
    assert not follow.done and follow.drain_call("acme") is None

    follow.feed({"type": "state", "state": "succeeded", "ended": True})
    call = follow.drain_call("acme")
    assert follow.done and call is not None
    assert call.params == {"since": "4", "limit": "5000"} and call.path == "tenants/acme/workloads/7/logs/"


def test_log_follow_drains_until_complete() -> None:
    follow = LogFollow(7, after=10)
    follow.feed({"type": "state", "state": "failed", "ended": True})

    first = LogPage.from_json({"lines": [{"seq": 10}, {"seq": 12}, {"seq": 11}], "next_since": 12, "complete": False})
    assert [line.seq for line in follow.feed_page(first)] == [11, 12]
    assert follow.drain_call("t") is not None
    assert follow.feed_page(LogPage.from_json({"lines": [], "next_since": 12, "complete": True})) == []
    assert follow.drain_call("t") is None


def test_events_and_metrics_messages() -> None:
    watch = EventsWatch("acme", "vision")
    snapshot = watch.feed({"type": "snapshot", "workloads": [{"id": 1, "state": "pending"}, {"id": 2}]})
    update = watch.feed({"type": "workload", "id": 1, "state": "running", "extra": True})

    assert watch.path == "/ws/t/acme/events/" and watch.query() == {"project": "vision"}
    assert [(r.id, r.snapshot) for r in snapshot] == [(1, True), (2, True)]
    assert [(r.id, r.state, r.snapshot) for r in update] == [(1, "running", False)]
    assert watch.feed({"type": "other"}) == []

    metrics = MetricsWatch(7)
    sample = {"type": "gpus", "node": "n1", "at": 5.0, "gpus": [{"uuid": "GPU-1", "index": 0, "power_w": None}]}
    (batch,) = metrics.feed(sample)
    assert (batch.node, batch.gpus[0].uuid, batch.gpus[0].power_w) == ("n1", "GPU-1", None)
    assert metrics.feed({"type": "allocations", "gpus": []}) == []


def test_wait_watch_signals_snapshot_own_rows_and_idleness() -> None:
    watch = WaitWatch("acme", "vision", 7)

    assert watch.feed({"type": "snapshot", "workloads": []}) == [7]
    assert watch.feed({"type": "workload", "id": 8}) == []
    assert watch.feed({"type": "workload", "id": 7}) == [7]
    assert watch.idle() == [7]


def test_wait_tracker_reports_changes_once_and_stops_at_rest() -> None:
    seen: list[str] = []
    tracker = WaitTracker(lambda detail: seen.append(detail.state))

    assert not tracker.update(WorkloadDetail.from_json({"id": 1, "state": "pending"}))
    assert not tracker.update(WorkloadDetail.from_json({"id": 1, "state": "pending"}))
    assert not tracker.update(WorkloadDetail.from_json({"id": 1, "state": "pending", "queue_position": 2}))
    assert tracker.update(WorkloadDetail.from_json({"id": 1, "state": "hibernated"}))
    assert seen == ["pending", "pending", "hibernated"]


def test_close_codes_that_forbid_reconnecting() -> None:
    def closed(code: int) -> ConnectionClosedError:
        return ConnectionClosedError(Close(code, "why"), None)

    not_found, unauthenticated = permanent_error(closed(4404)), permanent_error(closed(4401))
    assert not_found is not None and not_found.exit_code == EXIT_NOT_FOUND and "why" in not_found.message
    assert unauthenticated is not None and unauthenticated.exit_code == EXIT_AUTH
    assert permanent_error(closed(1011)) is None and permanent_error(OSError("reset")) is None


def test_reconnect_backs_off_doubling_to_a_cap_then_gives_up() -> None:
    backoff = Reconnect(base=0.2, cap=5.0, max_failures=7)
    delays = [backoff.delay(OSError("refused")) for _ in range(7)]

    assert all(0.5 * full <= d <= full for d, full in zip(delays, [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0], strict=True))
    with pytest.raises(ConnectionFailed):
        backoff.delay(OSError("refused"))
    backoff.received()
    assert backoff.delay(OSError("refused")) <= 0.2


# --- through a socket -----------------------------------------------------------------------

Script = Callable[[ServerConnection, int], None]


@contextmanager
def _ws_server(script: Script) -> Iterator[tuple[str, list[ServerConnection]]]:
    """Serve WebSockets on loopback, running `script(connection, n)` for the n-th connection (from 0)."""
    connections: list[ServerConnection] = []

    def handle(connection: ServerConnection) -> None:
        connections.append(connection)
        script(connection, len(connections) - 1)

    with serve(handle, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        port = server.socket.getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}", connections
        finally:
            server.shutdown()
            thread.join(timeout=5)


def _drop_then_end(connection: ServerConnection, number: int) -> None:
    if number == 0:
        connection.send(json.dumps(_lines(1, 2, 3, snapshot=True)))
        connection.close(code=1012, reason="restarting")  # a server restart: the client must come back
        return
    connection.send(json.dumps(_lines(3, 4, 5, snapshot=True)))  # overlaps what the client has
    connection.send(json.dumps({"type": "state", "state": "succeeded", "ended": True}))
    connection.recv()  # hold the connection until the client leaves


def _drain_handler(seen: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        lines = [{"seq": s, "text": f"line {s}"} for s in (5, 6)]
        return httpx.Response(200, json={"lines": lines, "next_since": 6, "complete": True})

    return httpx.MockTransport(handle)


def test_follow_logs_resumes_after_a_drop_without_gaps_or_repeats() -> None:
    drains: list[httpx.Request] = []
    with _ws_server(_drop_then_end) as (url, connections):
        context = Context("t", url, TOKEN, tenant="acme")
        with Client(context, transport=_drain_handler(drains)) as gpc:
            seqs = [line.seq for line in gpc.follow_logs(7, tail=100)]

    assert seqs == [1, 2, 3, 4, 5, 6]
    assert [c.request.path for c in connections if c.request] == [
        "/ws/workloads/7/logs/?tail=100",
        "/ws/workloads/7/logs/?after=3",
    ]
    first = connections[0].request
    assert first is not None
    assert first.headers["Authorization"] == f"Bearer {TOKEN}" and "Origin" not in first.headers
    assert [r.url.params["since"] for r in drains] == ["5"]


def test_async_follow_logs_resumes_the_same_way() -> None:
    drains: list[httpx.Request] = []

    async def follow(url: str) -> list[int]:
        context = Context("t", url, TOKEN, tenant="acme")
        async with AsyncClient(context, transport=_drain_handler(drains)) as gpc:
            return [line.seq async for line in gpc.follow_logs(7)]

    with _ws_server(_drop_then_end) as (url, connections):
        seqs = asyncio.run(follow(url))

    assert seqs == [1, 2, 3, 4, 5, 6]
    assert [c.request.path for c in connections if c.request] == [
        "/ws/workloads/7/logs/",
        "/ws/workloads/7/logs/?after=3",
    ]


def test_a_refusing_close_code_stops_without_reconnecting() -> None:
    def refuse(connection: ServerConnection, number: int) -> None:
        connection.close(code=4404, reason="not found")

    with (
        _ws_server(refuse) as (url, connections),
        Client(Context("t", url, TOKEN, tenant="acme")) as gpc,
        pytest.raises(StreamError) as caught,
    ):
        list(gpc.watch())

    assert len(connections) == 1 and caught.value.exit_code == EXIT_NOT_FOUND


def _details(*states: str) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """Answer `GET workloads/7/` with `states` in turn (the last one again once they run out)."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        state = states[min(len(seen), len(states)) - 1]
        return httpx.Response(200, json={"id": 7, "project": "vision", "state": state, "exit_code": None})

    return httpx.MockTransport(handle), seen


def test_wait_follows_the_events_stream_until_the_workload_rests() -> None:
    def events(connection: ServerConnection, number: int) -> None:
        connection.send(json.dumps({"type": "snapshot", "workloads": [{"id": 7, "state": "pending"}]}))
        connection.send(json.dumps({"type": "workload", "id": 8, "state": "running"}))
        connection.send(json.dumps({"type": "workload", "id": 7, "state": "running"}))
        connection.send(json.dumps({"type": "workload", "id": 7, "state": "succeeded"}))
        connection.recv()

    transport, seen = _details("pending", "pending", "running", "succeeded")
    changes: list[str] = []
    with (
        _ws_server(events) as (url, connections),
        Client(Context("t", url, TOKEN, tenant="acme"), transport=transport) as gpc,
    ):
        final = gpc.wait(7, on_change=lambda detail: changes.append(detail.state))

    assert final.state == "succeeded" and changes == ["pending", "running", "succeeded"]
    assert len(seen) == 4  # the first read, the snapshot's, and one per row about workload 7
    assert connections[0].request is not None and connections[0].request.path == "/ws/t/acme/events/?project=vision"


def test_wait_falls_back_to_polling_when_the_stream_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpucloud_client.client as sync_client

    monkeypatch.setattr(sync_client, "WAIT_POLL_SECONDS", 0.01)

    def refuse(connection: ServerConnection, number: int) -> None:
        connection.close(code=4403, reason="revoked")

    transport, seen = _details("pending", "running", "running", "failed")
    with (
        _ws_server(refuse) as (url, connections),
        Client(Context("t", url, TOKEN, tenant="acme"), transport=transport) as gpc,
    ):
        final = gpc.wait(7)

    assert final.state == "failed" and len(seen) == 4 and len(connections) == 1
