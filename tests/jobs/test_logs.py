"""Workload logs: the chained ingest, numbering across replicas, reads through the API, retention."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from common.protocol.messages import LogBatches
from common.task_names import INGEST_LOGS
from gpucloud.celery import app
from inventory.models import Node
from jobs import selectors
from jobs.choices import WorkloadState
from jobs.models import LogChunk, Replica, Workload
from jobs.services import ingest_log_batch, purge_expired_logs
from jobs.services.execution import container_name
from jobs.services.logs import MAX_LINE_CHARS, TRUNCATION_MARKER, LogBatchError, ingest_log_batches
from tenants.models import Tenant
from tenants.scoping import tenant_scope
from tests.conftest import World, client_for
from tests.jobs.factories import add_node
from tests.workers import running_worker, wait_until

pytestmark = pytest.mark.django_db

URL = "/api/v1/tenants/tenant-a/workloads/{pk}/logs/"


def _running(world: World, *, replicas: int = 2, project: Any = None, owner: Any = None) -> Workload:
    """A running workload of `replicas` replicas (attempt 1) on node n1, with no log yet."""
    project = project or world.project_a
    node = Node.objects.filter(name="n1").first() or add_node(world, "n1")
    workload = Workload.all_tenants.create(
        tenant_id=project.tenant_id,
        project=project,
        owner=owner or world.member_a,
        name="train",
        image="registry.example.com/team/train:1.0",
        pool=world.pool,
        replicas=replicas,
        state=WorkloadState.RUNNING,
    )
    for index in range(replicas):
        Replica.all_tenants.create(
            tenant_id=workload.tenant_id,
            workload=workload,
            attempt=1,
            index=index,
            node=node,
            name=container_name(workload.pk, index, 1),
        )
    return workload


def _lines(n: int, prefix: str = "line", stream: str = "stdout", start: int = 0) -> list[list[str]]:
    base = datetime(2025, 1, 1, tzinfo=UTC)
    return [
        [(base + timedelta(seconds=start + i)).isoformat().replace("+00:00", "Z"), stream, f"{prefix} {start + i}"]
        for i in range(n)
    ]


def _ingest(workload: Workload, *, replica: int = 0, since: str = "", cursor: str, lines: list[list[str]]) -> int:
    return ingest_log_batch(
        workload_id=workload.pk, attempt=1, replica=replica, since=since, cursor=cursor, lines=lines
    )


def _stored(workload: Workload) -> list[list[Any]]:
    chunks = LogChunk.all_tenants.filter(workload=workload).order_by("first_seq")
    return [line for chunk in chunks for line in chunk.lines]


def _cursor(workload: Workload, replica: int = 0) -> str:
    return Replica.all_tenants.get(workload=workload, attempt=1, index=replica).log_cursor


# --- ingest -------------------------------------------------------------------------------


def test_a_batch_that_continues_the_chain_is_stored_once(world: World) -> None:
    workload = _running(world)
    assert _ingest(workload, since="", cursor="c2", lines=_lines(2)) == 2
    assert _ingest(workload, since="", cursor="c2", lines=_lines(2)) == 0, "a redelivered batch is dropped"
    assert _ingest(workload, since="c2", cursor="c5", lines=_lines(3, start=2)) == 3
    assert _ingest(workload, since="c2", cursor="c5", lines=_lines(3, start=2)) == 0, "a replay from an older cursor"
    stored = _stored(workload)
    assert [line[0] for line in stored] == [1, 2, 3, 4, 5]
    assert [line[3] for line in stored] == [f"line {i}" for i in range(5)]
    assert stored[0] == [1, "2025-01-01T00:00:00Z", "stdout", "line 0", 1, 0]
    assert LogChunk.all_tenants.filter(workload=workload).count() == 2
    assert (_cursor(workload), Workload.all_tenants.get(pk=workload.pk).log_seq) == ("c5", 5)
    chunk = LogChunk.all_tenants.filter(workload=workload).order_by("first_seq").last()
    assert chunk is not None and (chunk.first_seq, chunk.last_seq) == (3, 5)
    assert chunk.first_at == datetime(2025, 1, 1, 0, 0, 2, tzinfo=UTC)
    assert chunk.last_at == datetime(2025, 1, 1, 0, 0, 4, tzinfo=UTC)


def test_replicas_share_one_sequence_and_keep_their_own_chain(world: World) -> None:
    workload = _running(world, replicas=2)
    assert _ingest(workload, replica=0, cursor="a1", lines=_lines(2, "r0")) == 2
    assert _ingest(workload, replica=1, cursor="b1", lines=_lines(3, "r1", stream="stderr")) == 3
    assert _ingest(workload, replica=0, since="a1", cursor="a2", lines=_lines(1, "r0", start=2)) == 1
    assert _ingest(workload, replica=1, since="a1", cursor="b2", lines=_lines(1, "r1")) == 0, "another replica's chain"
    stored = _stored(workload)
    assert [(line[0], line[5], line[2]) for line in stored] == [
        (1, 0, "stdout"),
        (2, 0, "stdout"),
        (3, 1, "stderr"),
        (4, 1, "stderr"),
        (5, 1, "stderr"),
        (6, 0, "stdout"),
    ]
    assert (_cursor(workload, 0), _cursor(workload, 1)) == ("a2", "b1")


def test_a_batch_for_an_unknown_replica_is_dropped_and_logged(world: World, caplog: Any) -> None:
    workload = _running(world, replicas=1)
    with caplog.at_level(logging.WARNING, logger="jobs.services.logs"):
        assert _ingest(workload, replica=5, cursor="x", lines=_lines(1)) == 0
        assert (
            ingest_log_batch(workload_id=workload.pk, attempt=9, replica=0, since="", cursor="x", lines=_lines(1)) == 0
        )
    assert "unknown replica" in caplog.text
    assert not LogChunk.all_tenants.exists()
    assert Workload.all_tenants.get(pk=workload.pk).log_seq == 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (["yesterday", "stdout", "x"], r"lines\[1\]\[0\]: 'yesterday' is not an RFC 3339 timestamp"),
        (["2025-01-01T00:00:00Z", "stdin", "x"], r"lines\[1\]\[1\]: stream 'stdin' is not stdout or stderr"),
        (["2025-01-01T00:00:00Z", "stdout"], r"lines\[1\]: expected \[timestamp, stream, text\] strings"),
        (["2025-01-01T00:00:00Z", "stdout", 7], r"lines\[1\]: expected"),
    ],
)
def test_a_malformed_batch_stores_nothing(world: World, line: list[Any], message: str) -> None:
    workload = _running(world, replicas=1)
    with pytest.raises(LogBatchError, match=message):
        _ingest(workload, cursor="c1", lines=[*_lines(1), line])
    assert not LogChunk.all_tenants.exists()
    assert _cursor(workload) == ""


def test_long_lines_are_truncated_and_unstorable_characters_replaced(world: World) -> None:
    workload = _running(world, replicas=1)
    long = "a" * 1000 + "b" * (MAX_LINE_CHARS * 2) + "z" * 1000
    batch = [
        ["2025-01-01T00:00:00.123456789Z", "stdout", long],
        ["2025-01-01T00:00:01+02:00", "stderr", "nul\x00 \ud800"],
    ]
    assert _ingest(workload, cursor="c", lines=batch) == 2
    first, second = _stored(workload)
    assert len(first[3]) == MAX_LINE_CHARS
    assert first[3].startswith("a" * 1000) and first[3].endswith("z" * 1000) and TRUNCATION_MARKER in first[3]
    assert first[1] == "2025-01-01T00:00:00.123456789Z", "timestamps are kept as the runtime wrote them"
    assert second[3] == "nul\ufffd \ufffd"


def test_an_empty_batch_only_moves_the_cursor(world: World) -> None:
    workload = _running(world, replicas=1)
    assert _ingest(workload, cursor="c1", lines=[]) == 0
    assert _cursor(workload) == "c1" and not LogChunk.all_tenants.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_ingests_never_reuse_a_number_nor_store_a_batch_twice(world: World) -> None:
    """8 replicas ship 25 batches each, every batch delivered twice at once: each line is stored once."""
    replicas, batches, per_batch = 8, 25, 20
    workload = _running(world, replicas=replicas)
    barrier = threading.Barrier(replicas * 2)
    errors: list[BaseException] = []

    def ship(replica: int) -> None:
        try:
            barrier.wait(timeout=30)
            for b in range(batches):
                since = f"r{replica}-{b}" if b else ""
                lines = _lines(per_batch, f"r{replica}", start=b * per_batch)
                _ingest(workload, replica=replica, since=since, cursor=f"r{replica}-{b + 1}", lines=lines)
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=ship, args=(r,)) for r in range(replicas) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    stored = _stored(workload)
    total = replicas * batches * per_batch
    assert [line[0] for line in stored] == list(range(1, total + 1))
    assert Workload.all_tenants.get(pk=workload.pk).log_seq == total
    for replica in range(replicas):
        texts = [line[3] for line in stored if line[5] == replica]
        assert texts == [f"r{replica} {i}" for i in range(batches * per_batch)], "each replica's lines, in order, once"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_batch_that_loses_a_deadlock_to_a_cancel_is_stored_all_the_same(world: World) -> None:
    """The chain locks the replica, then the workload; a cancel locks them the other way round. Postgres aborts
    the batch (it waited first); the batch is stored on its next try, once, in order."""
    workload = _running(world, replicas=1)
    replica = Replica.all_tenants.get(workload=workload, index=0)
    stored: list[int] = []
    errors: list[BaseException] = []
    cancel = connections.create_connection("default")
    try:
        with cancel.cursor() as cursor:
            cursor.execute("BEGIN")
            lock = f"SELECT 1 FROM {Workload._meta.db_table} WHERE id = %s FOR UPDATE"  # noqa: S608 -- model metadata
            cursor.execute(lock, [workload.pk])

            def ship() -> None:
                try:
                    stored.append(_ingest(workload, cursor="c1", lines=_lines(3)))
                except BaseException as error:  # reported below
                    errors.append(error)
                finally:
                    connections.close_all()

            batch = threading.Thread(target=ship)
            batch.start()
            # Once the batch holds the replica and waits for the workload, the "cancel" asks for the replica.
            assert wait_until(lambda: _sessions_waiting_on_a_lock() > 0, timeout=30)
            column = cancel.ops.quote_name(Replica._meta.get_field("index").column)
            touch = f"UPDATE {Replica._meta.db_table} SET {column} = {column} WHERE id = %s"  # noqa: S608 -- metadata
            cursor.execute(touch, [replica.pk])
            cursor.execute("COMMIT")
        batch.join(timeout=60)
    finally:
        cancel.close()
    assert not errors, errors
    assert stored == [3]
    assert [line[3] for line in _stored(workload)] == ["line 0", "line 1", "line 2"]


def _sessions_waiting_on_a_lock() -> int:
    """Return how many other sessions of this database wait for a lock (read on a connection of its own)."""
    probe = connections.create_connection("default")
    try:
        with probe.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            return int(cursor.fetchone()[0])
    finally:
        probe.close()


# --- reads through the API ------------------------------------------------------------------


def _fill(workload: Workload, n: int, *, per_batch: int = 10) -> None:
    for b in range(0, n, per_batch):
        since = f"c{b}" if b else ""
        _ingest(workload, since=since, cursor=f"c{b + per_batch}", lines=_lines(min(per_batch, n - b), start=b))


def test_tail_then_page_forward(world: World) -> None:
    workload = _running(world, replicas=1)
    _fill(workload, 95)
    client = client_for(world.viewer_a)
    tail = client.get(URL.format(pk=workload.pk), {"limit": 7}).json()
    assert [line["seq"] for line in tail["lines"]] == list(range(89, 96))
    assert tail["lines"][-1] == {
        "seq": 95,
        "timestamp": "2025-01-01T00:01:34Z",
        "stream": "stdout",
        "text": "line 94",
        "attempt": 1,
        "replica": 0,
    }
    assert (tail["next_since"], tail["complete"]) == (95, False)
    page = client.get(URL.format(pk=workload.pk), {"since": 12, "limit": 25}).json()
    assert [line["seq"] for line in page["lines"]] == list(range(13, 38))
    assert page["next_since"] == 37
    rest = client.get(URL.format(pk=workload.pk), {"since": 90}).json()
    assert [line["seq"] for line in rest["lines"]] == [91, 92, 93, 94, 95]
    nothing = client.get(URL.format(pk=workload.pk), {"since": 95}).json()
    assert (nothing["lines"], nothing["next_since"], nothing["complete"]) == ([], 95, False)
    default = client.get(URL.format(pk=workload.pk)).json()
    assert len(default["lines"]) == 95, "default: the last 1000 lines"


def test_an_ended_workload_reads_complete_once_its_last_line_is_read(world: World) -> None:
    workload = _running(world, replicas=1)
    _fill(workload, 30)
    Workload.all_tenants.filter(pk=workload.pk).update(state=WorkloadState.SUCCEEDED)
    client = client_for(world.member_a)
    first = client.get(URL.format(pk=workload.pk), {"since": 0, "limit": 20}).json()
    assert (first["next_since"], first["complete"]) == (20, False)
    last = client.get(URL.format(pk=workload.pk), {"since": 20, "limit": 20}).json()
    assert (last["next_since"], last["complete"]) == (30, True)


@pytest.mark.parametrize(
    ("query", "field", "code"),
    [
        ({"limit": 0}, "limit", "min_value"),
        ({"limit": 5001}, "limit", "max_value"),
        ({"limit": "many"}, "limit", "invalid"),
        ({"since": -1}, "since", "min_value"),
        ({"since": "x"}, "since", "invalid"),
    ],
)
def test_bad_parameters_are_a_400_naming_them(world: World, query: dict[str, Any], field: str, code: str) -> None:
    workload = _running(world, replicas=1)
    response = client_for(world.viewer_a).get(URL.format(pk=workload.pk), query)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["fields"][field][0]["code"] == code
    assert error["message"].startswith(f"{field}: ")


def test_download_streams_the_whole_log_as_text(world: World) -> None:
    workload = _running(world, replicas=2)
    _ingest(workload, replica=0, cursor="a", lines=_lines(2))
    _ingest(workload, replica=1, cursor="b", lines=[["2025-01-01T00:00:05Z", "stderr", "boom: x y"]])
    response = client_for(world.viewer_a).get(f"{URL.format(pk=workload.pk)}download/", HTTP_ACCEPT="text/plain")
    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="train-{workload.pk}.log"'
    assert response.getvalue().decode() == (
        "2025-01-01T00:00:00Z stdout line 0\n"
        "2025-01-01T00:00:01Z stdout line 1\n"
        "2025-01-01T00:00:05Z stderr boom: x y\n"
    )


def test_the_download_reads_in_chunks_and_needs_no_scope_left_over_from_the_request(world: World) -> None:
    workload = _running(world, replicas=1)
    _fill(workload, 50, per_batch=5)
    with tenant_scope(world.tenant_a):
        lines = selectors.iter_log_lines(Workload.objects.get(pk=workload.pk), chunks_per_read=3)
    with CaptureQueriesContext(connections["default"]) as queries:
        seqs = [line["seq"] for line in lines]  # consumed outside any scope, as a streamed response is
    assert seqs == list(range(1, 51))
    assert len(queries) == 1 + 4, "the tenant, then 10 chunks 3 at a time"


def test_other_tenants_get_404_for_logs_and_download(world: World) -> None:
    workload = _running(world, replicas=1)
    _fill(workload, 3)
    outsider = client_for(world.admin_b)
    for suffix in ("", "download/"):
        response = outsider.get(f"{URL.format(pk=workload.pk)}{suffix}")
        assert response.status_code == 404, suffix
        assert response.json()["error"]["code"] == "not_found"
    # Nor through their own tenant's URL.
    assert outsider.get(f"/api/v1/tenants/tenant-b/workloads/{workload.pk}/logs/").status_code == 404
    assert client_for(None).get(URL.format(pk=workload.pk)).status_code == 401


def test_reads_skip_what_retention_removed(world: World) -> None:
    workload = _running(world, replicas=1)
    _fill(workload, 40)
    LogChunk.all_tenants.filter(workload=workload, last_seq__lte=20).delete()
    page = client_for(world.viewer_a).get(URL.format(pk=workload.pk), {"since": 0, "limit": 5}).json()
    assert [line["seq"] for line in page["lines"]] == [21, 22, 23, 24, 25]


# --- retention ------------------------------------------------------------------------------


def test_retention_uses_the_tenants_period_else_the_platform_default(world: World, settings: Any) -> None:
    settings.LOG_RETENTION_DAYS = 30
    Tenant.objects.filter(pk=world.tenant_b.pk).update(log_retention_days=7)
    ours = _running(world, replicas=1)
    theirs = _running(world, replicas=1, project=world.project_b, owner=world.admin_b)
    now = datetime(2025, 3, 1, tzinfo=UTC)
    for workload in (ours, theirs):
        _fill(workload, 40)
        chunks = LogChunk.all_tenants.filter(workload=workload).order_by("first_seq")
        for chunk, age in zip(chunks, (31, 20, 8, 1), strict=True):
            LogChunk.all_tenants.filter(pk=chunk.pk).update(created_at=now - timedelta(days=age))
    assert purge_expired_logs(now=now, batch=1) == 1 + 3  # ours: 31 days old; theirs: 31, 20 and 8
    assert list(LogChunk.all_tenants.filter(workload=ours).values_list("first_seq", flat=True)) == [11, 21, 31]
    assert list(LogChunk.all_tenants.filter(workload=theirs).values_list("first_seq", flat=True)) == [31]
    assert purge_expired_logs(now=now) == 0


@pytest.mark.django_db(transaction=True)
def test_a_batch_that_arrives_before_its_predecessor_waits_for_it_through_the_worker(world: World) -> None:
    workload = _running(world, replicas=1)
    first = {"since": "", "cursor": "c1", "lines": _lines(2)}
    second = {"since": "c1", "cursor": "c2", "lines": _lines(3, start=2)}
    ids = {"workload_id": workload.pk, "attempt": 1, "replica": 0}
    with running_worker(["control", "ingest"], concurrency=2):
        app.send_task(INGEST_LOGS, kwargs={**ids, **second}, queue="ingest")
        app.send_task(INGEST_LOGS, kwargs={**ids, **first}, queue="ingest")
        assert wait_until(lambda: _cursor(workload) == "c2", timeout=10)
    assert [line[0] for line in _stored(workload)] == [1, 2, 3, 4, 5]
    assert [line[3] for line in _stored(workload)] == [f"line {i}" for i in range(5)]


@pytest.mark.django_db(transaction=True)
def test_a_nodes_message_of_batches_stores_each_replica_in_order_and_retries_the_early_ones(world: World) -> None:
    """A node's message carries batches of several replicas; one whose predecessor is late comes back later."""
    workload = _running(world, replicas=2)
    ids = {"workload_id": workload.pk, "attempt": 1}
    early = {**ids, "replica": 0, "since": "a1", "cursor": "a2", "lines": _lines(2, "r0", start=2)}
    message = [
        early,
        {**ids, "replica": 1, "since": "", "cursor": "b1", "lines": _lines(3, "r1")},
        {**ids, "replica": 1, "since": "b1", "cursor": "b2", "lines": _lines(1, "r1", start=3)},
    ]
    late = {**ids, "replica": 0, "since": "", "cursor": "a1", "lines": _lines(2, "r0")}
    with running_worker(["control", "ingest"], concurrency=2):
        app.send_task(LogBatches.TASK, kwargs={"batches": message}, queue="ingest")
        assert wait_until(lambda: _cursor(workload, replica=1) == "b2", timeout=10)
        assert _cursor(workload, replica=0) == "", "replica 0 waits for its first batch"
        app.send_task(LogBatches.TASK, kwargs={"batches": [late]}, queue="ingest")
        assert wait_until(lambda: _cursor(workload, replica=0) == "a2", timeout=10)
    stored = _stored(workload)
    assert [line[0] for line in stored] == list(range(1, 9)), "numbered once each, no gap"
    assert [line[3] for line in stored if line[5] == 0] == [f"r0 {i}" for i in range(4)]
    assert [line[3] for line in stored if line[5] == 1] == [f"r1 {i}" for i in range(4)]


def test_a_malformed_batch_in_a_nodes_message_costs_only_its_own_lines(world: World) -> None:
    workload = _running(world, replicas=2)
    ids = {"workload_id": workload.pk, "attempt": 1}
    broken = {**ids, "replica": 0, "since": "", "cursor": "a1", "lines": [["not a time", "stdout", "x"]]}
    fine = {**ids, "replica": 1, "since": "", "cursor": "b1", "lines": _lines(2, "r1")}
    assert ingest_log_batches([broken, fine], wait_seconds=0) == []
    assert [line[3] for line in _stored(workload)] == ["r1 0", "r1 1"]
    assert _cursor(workload, replica=0) == ""


def test_a_replayed_batch_is_never_stored_twice(world: World) -> None:
    """One ending where the chain stands is skipped at once; an older one waits, and its retries run out."""
    workload = _running(world, replicas=1)
    ids = {"workload_id": workload.pk, "attempt": 1, "replica": 0}
    first = {**ids, "since": "", "cursor": "c1", "lines": _lines(2)}
    second = {**ids, "since": "c1", "cursor": "c2", "lines": _lines(1, start=2)}
    assert ingest_log_batches([first], wait_seconds=0) == []
    assert ingest_log_batches([first], wait_seconds=0.05) == []
    assert ingest_log_batches([second], wait_seconds=0) == []
    assert ingest_log_batches([first], wait_seconds=0.05) == [first]
    assert len(_stored(workload)) == 3
