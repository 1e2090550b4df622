"""Live logs: snapshot then batches, resume after a reconnect, lines stored while connecting, gaps filled."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async

from jobs.models import Workload
from tests.conftest import World
from tests.frontend import live
from tests.frontend.live import open_stream, receive, session_headers
from tests.jobs.test_logs import _ingest, _lines, _running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_live_layer")]
fresh_live_layer = live.fresh_live_layer


def _store(workload: Workload, first: int, count: int) -> None:
    """Store lines `first` .. `first + count - 1` of replica 0 as one batch continuing its chain."""
    since = "" if first == 0 else f"c{first}"
    assert _ingest(workload, since=since, cursor=f"c{first + count}", lines=_lines(count, start=first)) == count


def _seqs(messages: list[dict[str, Any]]) -> list[int]:
    return [line[0] for message in messages for line in message["lines"]]


def test_snapshot_then_live_batches_in_the_stored_format(world: World) -> None:
    workload = _running(world, replicas=1)
    _store(workload, 0, 5)
    headers = session_headers(world.viewer_a)

    async def scenario() -> None:
        stream, connected, _ = await open_stream(f"/ws/workloads/{workload.pk}/logs/?tail=3", headers=headers)
        assert connected
        snapshot = await receive(stream)
        assert snapshot["type"] == "lines" and snapshot["snapshot"] is True
        assert [line[0] for line in snapshot["lines"]] == [3, 4, 5]
        _, timestamp, stream_name, text, attempt, replica = snapshot["lines"][0]
        assert (stream_name, text, attempt, replica) == ("stdout", "line 2", 1, 0)
        assert timestamp.startswith("2025-01-01T00:00:02")
        assert await receive(stream) == {"type": "state", "state": "running", "ended": False}
        await database_sync_to_async(_store)(workload, 5, 2)
        batch = await receive(stream)
        assert batch["type"] == "lines" and "snapshot" not in batch
        assert [line[0] for line in batch["lines"]] == [6, 7]
        await stream.disconnect()

    async_to_sync(scenario)()


def test_reconnect_with_after_gets_exactly_the_missing_lines(world: World) -> None:
    workload = _running(world, replicas=1)
    _store(workload, 0, 4)
    headers = session_headers(world.member_a)

    async def scenario() -> None:
        stream, _, _ = await open_stream(f"/ws/workloads/{workload.pk}/logs/", headers=headers)
        first = await receive(stream)
        assert _seqs([first]) == [1, 2, 3, 4]
        last = first["lines"][-1][0]
        await stream.disconnect()
        await database_sync_to_async(_store)(workload, 4, 2500)  # more than two pages
        stream, _, _ = await open_stream(f"/ws/workloads/{workload.pk}/logs/?after={last}", headers=headers)
        pages = [await receive(stream) for _ in range(3)]
        assert [page.get("snapshot", False) for page in pages] == [True, False, False]
        assert [len(page["lines"]) for page in pages] == [1000, 1000, 500]
        assert _seqs(pages) == list(range(5, 2505))
        assert (await receive(stream))["type"] == "state"
        await stream.disconnect()

    async_to_sync(scenario)()


def test_lines_stored_while_connecting_are_neither_lost_nor_doubled(world: World, monkeypatch: Any) -> None:
    """A batch stored after the stream joined its group but before it read the snapshot arrives twice
    (in the snapshot and as a message); one stored after the snapshot arrives once. Each line is sent once."""
    from frontend.consumers import logs as consumer_module
    from jobs import selectors

    workload = _running(world, replicas=1)
    _store(workload, 0, 3)
    reads = {"n": 0}

    def tail_with_a_race(target: Workload, *, tail: int) -> tuple[int, list[list[Any]]]:
        reads["n"] += 1
        _store(workload, 3, 2)  # committed between the join and the snapshot read
        snapshot = selectors.live_log_tail(target, tail=tail)
        _store(workload, 5, 2)  # committed after the snapshot read, before the stream goes live
        return snapshot

    monkeypatch.setattr(consumer_module, "live_log_tail", tail_with_a_race)
    headers = session_headers(world.admin_a)

    async def scenario() -> None:
        stream, _, _ = await open_stream(f"/ws/workloads/{workload.pk}/logs/", headers=headers)
        messages = [await receive(stream)]
        assert (await receive(stream))["type"] == "state"
        messages.append(await receive(stream))
        assert await stream.receive_nothing(timeout=0.5)
        assert _seqs(messages) == [1, 2, 3, 4, 5, 6, 7]
        await stream.disconnect()

    async_to_sync(scenario)()
    assert reads["n"] == 1


def test_a_missed_batch_is_filled_in_from_the_database(world: World, monkeypatch: Any) -> None:
    """Lines 3-4 are stored but their message never arrives; when 5-6 arrive, the stream sends 3-6 in order."""
    from jobs import live as publishers

    workload = _running(world, replicas=1)
    _store(workload, 0, 2)
    headers = session_headers(world.admin_a)

    def store_unannounced() -> None:
        with monkeypatch.context() as patch:
            patch.setattr(publishers, "publish_log_lines", lambda *args: None)
            _store(workload, 2, 2)

    async def scenario() -> None:
        stream, _, _ = await open_stream(f"/ws/workloads/{workload.pk}/logs/", headers=headers)
        assert _seqs([await receive(stream)]) == [1, 2]
        assert (await receive(stream))["type"] == "state"
        await database_sync_to_async(store_unannounced)()
        assert await stream.receive_nothing(timeout=0.3)
        await database_sync_to_async(_store)(workload, 4, 2)
        assert _seqs([await receive(stream)]) == [3, 4, 5, 6]
        assert await stream.receive_nothing(timeout=0.3)
        await stream.disconnect()

    async_to_sync(scenario)()


def test_bad_parameters_close_with_4400_naming_the_field(world: World) -> None:
    workload = _running(world, replicas=1)
    headers = session_headers(world.admin_a)

    async def scenario() -> None:
        for query, field in (
            ("tail=5001", "tail"),
            ("tail=-1", "tail"),
            ("after=x", "after"),
            ("tail=1&after=2", "tail"),
        ):
            stream, connected, _ = await open_stream(f"/ws/workloads/{workload.pk}/logs/?{query}", headers=headers)
            assert connected
            output = await stream.receive_output(timeout=5)
            assert (output["type"], output["code"]) == ("websocket.close", 4400)
            assert output["reason"].startswith(field)
            await stream.disconnect()

    async_to_sync(scenario)()


def test_a_state_change_is_sent_once(world: World) -> None:
    from jobs.choices import WorkloadState
    from jobs.services import transition_workload

    workload = _running(world, replicas=1)
    headers = session_headers(world.viewer_a)

    def succeed() -> None:
        assert transition_workload(
            workload_id=workload.pk, from_states=[WorkloadState.RUNNING], to_state=WorkloadState.SUCCEEDED
        )

    async def scenario() -> None:
        stream, _, _ = await open_stream(f"/ws/workloads/{workload.pk}/logs/?tail=0", headers=headers)
        assert await receive(stream) == {"type": "lines", "snapshot": True, "lines": []}
        assert (await receive(stream))["state"] == "running"
        await database_sync_to_async(succeed)()
        assert await receive(stream) == {"type": "state", "state": "succeeded", "ended": True}
        assert await stream.receive_nothing(timeout=0.3)
        await stream.disconnect()

    async_to_sync(scenario)()


def _exit_overtaking_its_output(workload: Workload) -> None:
    """The replica's exit report (its output ends at c7) is stored before its last batch (lines 5..7)."""
    from jobs.tasks import replica_exited

    assert replica_exited(workload_id=workload.pk, attempt=1, replica=0, exit_code=0, log_cursor="c7")
    assert Workload.all_tenants.get(pk=workload.pk).state == "succeeded"


def test_ended_waits_for_the_output_an_exit_report_overtook(world: World) -> None:
    workload = _running(world, replicas=1)
    _store(workload, 0, 4)
    headers = session_headers(world.viewer_a)

    async def scenario() -> None:
        stream, _, _ = await open_stream(f"/ws/workloads/{workload.pk}/logs/", headers=headers)
        assert _seqs([await receive(stream)]) == [1, 2, 3, 4]
        assert (await receive(stream))["ended"] is False
        await database_sync_to_async(_exit_overtaking_its_output)(workload)
        # Succeeded, but lines are on their way: a client that stops at `ended` must not stop yet.
        assert await receive(stream) == {"type": "state", "state": "succeeded", "ended": False}
        await database_sync_to_async(_store)(workload, 4, 3)
        assert _seqs([await receive(stream)]) == [5, 6, 7]
        assert await receive(stream) == {"type": "state", "state": "succeeded", "ended": True}
        assert await stream.receive_nothing(timeout=0.3)
        await stream.disconnect()
        # A stream opened once everything is stored says `ended` at once.
        stream, _, _ = await open_stream(f"/ws/workloads/{workload.pk}/logs/?after=7", headers=headers)
        assert (await receive(stream))["lines"] == []
        assert await receive(stream) == {"type": "state", "state": "succeeded", "ended": True}
        await stream.disconnect()

    async_to_sync(scenario)()


def test_the_log_page_is_complete_only_once_the_overtaken_output_is_stored(world: World) -> None:
    from tests.conftest import client_for

    workload = _running(world, replicas=1)
    _store(workload, 0, 4)
    _exit_overtaking_its_output(workload)
    url = f"/api/v1/tenants/tenant-a/workloads/{workload.pk}/logs/?since=4"
    reader = client_for(world.viewer_a)
    assert reader.get(url).json() == {"lines": [], "next_since": 4, "complete": False}
    _store(workload, 4, 3)
    page = reader.get(url).json()
    assert ([line["seq"] for line in page["lines"]], page["complete"]) == ([5, 6, 7], True)
