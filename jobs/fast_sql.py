"""The jobs app's hand-written SQL: the reads every submission makes, its event insert, the scheduler's reasons and
plans and the log chain's one statement.

A fast path (docs/fastpaths.md): `GPUCLOUD_FAST_PATHS_OFF=jobs_sql` turns
it off, and each function here answers through its ORM form beside it
(`_<name>_by_orm`; the log chain: `jobs.services.logs.chain._store`), with
the same answers. Its benchmark is `bench/fast_sql.py`, each statement
timed with the switch on and off (docs/fastpaths.md has the figures: from
3.8 to 15.7 times faster than its ORM form); the paths they serve are
measured by `bench/submissions.py` (single and bulk submissions a second),
`bench/scheduler_shell.py` (a pass's commit of every reason) and
`bench/log_follow.py` (log batches stored as they arrive). The medians
below are what each statement was written for.

Written out rather than built by the ORM because the ORM was slower by far
more than a few percent. Medians on Postgres (scratch database: 1,000 GPUs
on 125 nodes, 5,000 workloads, 32 submissions' worth of keys), here
against the closest ORM form:

- allowed images of 3 tenants: 0.15 ms against 0.51 ms (Q objects, Subquery);
- quota limits of 32 pairs, locked: 0.9 ms against 4.3 ms (1 pair: 0.5 against
  1.8), the tenant's limits as three subqueries and `select_for_update(of=...)`;
- GPU counts of 4 pools: 0.6 ms against 1.1 ms;
- 32 submitted events: 0.7 ms against 1.3 ms with `bulk_create` (1,000:
  5 ms against 27 ms);
- reasons of 32 waiting workloads: 2.6 ms against 12 ms with `bulk_update`,
  which builds a CASE expression per row and field (1,000: 0.13 s against 0.7 s);
  start estimates and reservations (`record_plans`) are written the same way;
- a log batch stored (Postgres only): one round trip, where the ORM path
  (`jobs.services.logs.chain._store`) makes four statements and a commit.

(The pending and notebook counts were here too. The pending counts'
statement saved 0.1 ms: 0.58 ms against 0.68 ms for the ORM's best form
(`__in` on each column, the keys picked in Python); `bench/fast_sql.py`
measured the notebook counts' best ORM form as fast as the statement
(8.3 ms against 9.5 ms, on a busy machine). The ORM's forms now serve
alone, in `jobs.services.quota_rules`.)

It depends on these framework internals: `_meta` (`db_table`, each
field's `column`), the backend's `quote_name` and `has_select_for_update_of`,
and the driver's `executemany`. Table and column names come from the
models' metadata (`common.sql`); every value is a parameter.
tests/jobs/test_fast_sql.py runs each function with the switch on and
off and compares the answers, on SQLite and Postgres (the log chain's on
Postgres only).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Count, Q, Subquery
from django.db.models.expressions import OuterRef

from common import fastpaths
from common.sql import column, fetch, is_in, pk, placeholders, table
from inventory.models import Gpu, Node, NodePool
from jobs.models import AllowedImage, LogChunk, Replica, Workload, WorkloadEvent
from tenants.models import ProjectQuota, TenantQuota

# The count limits a quota row holds, as the project's and then the tenant's columns of `quota_limits`.
LIMIT_FIELDS = ("max_pending_workloads", "max_notebooks_per_user", "max_runtime_seconds")


def allowed_image_rows(tenant_ids: Collection[int]) -> list[tuple[int | None, str, bool]]:
    """Return (tenant id, pattern, notebook) of the allowed images of `tenant_ids` (at least one), of the
    platform-wide ones (tenant id None), and of the platform's first pattern whoever's it is, so that the
    result is empty exactly when the platform has no pattern at all.

    One query; locks nothing; in no particular order.
    """
    if not fastpaths.enabled(fastpaths.JOBS_SQL):
        return _allowed_image_rows_by_orm(tenant_ids)
    tenant, pattern, notebook = (column(AllowedImage, name) for name in ("tenant", "pattern", "notebook"))
    first = f"SELECT MIN({pk(AllowedImage)}) FROM {table(AllowedImage)}"  # noqa: S608 -- names from the models' metadata
    where = f"{tenant} IN ({placeholders(len(tenant_ids))}) OR {tenant} IS NULL OR {pk(AllowedImage)} = ({first})"
    sql = f"SELECT {tenant}, {pattern}, {notebook} FROM {table(AllowedImage)} WHERE {where}"  # noqa: S608 -- names from the models' metadata; every value is a parameter
    return [(owner, text, bool(serves)) for owner, text, serves in fetch(sql, list(tenant_ids))]


def _allowed_image_rows_by_orm(tenant_ids: Collection[int]) -> list[tuple[int | None, str, bool]]:
    """The framework's path to `allowed_image_rows`' answer."""
    first = AllowedImage.objects.order_by("pk").values("pk")[:1]
    found = AllowedImage.objects.filter(
        Q(tenant_id__in=list(tenant_ids)) | Q(tenant__isnull=True) | Q(pk=Subquery(first))
    )
    return list(found.values_list("tenant_id", "pattern", "notebook"))


def quota_limits(keys: Sequence[tuple[int, int]], *, lock: bool) -> list[tuple[Any, ...]]:
    """Return the project quota rows of these (project id, pool id) pairs (at least one) as (project id,
    pool id, limit, then the project's and the tenant's LIMIT_FIELDS in that pool), the tenant's None
    where it has no quota there; a pair without a project quota is left out.

    Ordered by project, then pool. With `lock`, locks the project quota rows (FOR UPDATE, in that order,
    so lockers never deadlock), never the tenant's, which are read as they stand, as the scheduler reads
    them; SQLite has no row locks (its writers take turns anyway).
    """
    if not fastpaths.enabled(fastpaths.JOBS_SQL):
        return _quota_limits_by_orm(keys, lock=lock)
    project, pool, tenant = (column(ProjectQuota, name) for name in ("project", "pool", "tenant"))
    own = ", ".join(f"pq.{column(ProjectQuota, name)}" for name in ("limit", *LIMIT_FIELDS))
    tenants = ", ".join(f"tq.{column(TenantQuota, name)}" for name in LIMIT_FIELDS)
    joined = f"tq.{column(TenantQuota, 'tenant')} = pq.{tenant} AND tq.{column(TenantQuota, 'pool')} = pq.{pool}"
    tables = f"{table(ProjectQuota)} pq LEFT JOIN {table(TenantQuota)} tq ON {joined}"
    where = f"(pq.{project}, pq.{pool}) IN ({', '.join(['(%s, %s)'] * len(keys))})"
    locking = " FOR UPDATE OF pq" if lock and connection.features.has_select_for_update_of else ""
    sql = (
        f"SELECT pq.{project}, pq.{pool}, {own}, {tenants} FROM {tables} WHERE {where} "  # noqa: S608 -- names from the models' metadata; every value is a parameter
        f"ORDER BY pq.{project}, pq.{pool}{locking}"
    )
    return fetch(sql, [value for key in keys for value in key])


def _quota_limits_by_orm(keys: Sequence[tuple[int, int]], *, lock: bool) -> list[tuple[Any, ...]]:
    """The framework's path to `quota_limits`' answer (the tenant's limits as subqueries)."""
    tenant_quota = TenantQuota.all_tenants.filter(tenant_id=OuterRef("tenant_id"), pool_id=OuterRef("pool_id"))
    pairs = Q()
    for project_id, pool_id in keys:
        pairs |= Q(project_id=project_id, pool_id=pool_id)
    found = (
        ProjectQuota.all_tenants.filter(pairs)
        .annotate(**{f"tenant_{name}": Subquery(tenant_quota.values(name)[:1]) for name in LIMIT_FIELDS})
        .order_by("project_id", "pool_id")
    )
    if lock:
        found = found.select_for_update(of=("self",))
    names = ("project_id", "pool_id", "limit", *LIMIT_FIELDS, *(f"tenant_{name}" for name in LIMIT_FIELDS))
    return [tuple(row) for row in found.values_list(*names)]


def gpu_counts(pool_ids: Collection[int], *, failed: str, gone_node_states: Collection[str]) -> list[tuple[Any, ...]]:
    """Return (pool id, node id, GPU model, count) of the present GPUs of `pool_ids` (at least one) whose
    health is not `failed`, on nodes of those pools in no state of `gone_node_states`.

    One query; locks nothing; in no particular order.
    """
    if not fastpaths.enabled(fastpaths.JOBS_SQL):
        return _gpu_counts_by_orm(pool_ids, failed=failed, gone_node_states=gone_node_states)
    node, model = column(Gpu, "node"), column(Gpu, "model")
    pool = f"n.{column(Node, 'pool')}"
    where = (
        f"g.{column(Gpu, 'present')} = %s AND g.{column(Gpu, 'health')} <> %s "
        f"AND {pool} IN ({placeholders(len(pool_ids))}) "
        f"AND n.{column(Node, 'state')} NOT IN ({placeholders(len(gone_node_states))})"
    )
    grouped = f"{pool}, g.{node}, g.{model}"
    tables = f"{table(Gpu)} g JOIN {table(Node)} n ON n.{pk(Node)} = g.{node}"
    sql = f"SELECT {grouped}, COUNT(*) FROM {tables} WHERE {where} GROUP BY {grouped}"  # noqa: S608 -- names from the models' metadata; every value is a parameter
    return fetch(sql, [True, failed, *pool_ids, *gone_node_states])


def _gpu_counts_by_orm(
    pool_ids: Collection[int], *, failed: str, gone_node_states: Collection[str]
) -> list[tuple[Any, ...]]:
    """The framework's path to `gpu_counts`' answer."""
    found = (
        Gpu.objects.filter(present=True, node__pool_id__in=list(pool_ids))
        .exclude(health=failed)
        .exclude(node__state__in=list(gone_node_states))
        .values_list("node__pool_id", "node_id", "model")
        .annotate(count=Count("*"))
        .order_by()
    )
    return [tuple(row) for row in found]


def insert_submitted_events(workload_ids: Sequence[int], *, kind: str, to_state: str, created_at: datetime) -> None:
    """Insert one WorkloadEvent of `kind` into `to_state` for each workload of `workload_ids`, in workload id
    order, with the workload's tenant and the message "Submitted by <owner's username>: <GPUs per replica
    times replicas> GPU(s) in pool <pool name>."; one INSERT ... SELECT from the workload rows.

    Locks nothing beyond the rows it inserts.
    """
    if not fastpaths.enabled(fastpaths.JOBS_SQL):
        _insert_submitted_events_by_orm(workload_ids, kind=kind, to_state=to_state, created_at=created_at)
        return
    names = ("tenant", "workload", "kind", "from_state", "to_state", "reason_code", "message", "created_at")
    columns = ", ".join(column(WorkloadEvent, name) for name in names)
    w = {name: f"w.{column(Workload, name)}" for name in ("tenant", "owner", "pool", "gpus_per_replica", "replicas")}
    username = f"u.{column(User, User.USERNAME_FIELD)}"
    total = f"CAST({w['gpus_per_replica']} * {w['replicas']} AS TEXT)"
    message = f"%s || {username} || %s || {total} || %s || p.{column(NodePool, 'name')} || %s"
    source = (
        f"{table(Workload)} w JOIN {table(NodePool)} p ON p.{pk(NodePool)} = {w['pool']} "
        f"JOIN {table(User)} u ON u.{pk(User)} = {w['owner']}"
    )
    rows = f"SELECT {w['tenant']}, w.{pk(Workload)}, %s, '', %s, '', {message}, %s FROM {source}"  # noqa: S608 -- names from the models' metadata; every value is a parameter
    where, ids = is_in(f"w.{pk(Workload)}", workload_ids)
    sql = f"INSERT INTO {table(WorkloadEvent)} ({columns}) {rows} WHERE {where} ORDER BY w.{pk(Workload)}"
    params = [kind, to_state, "Submitted by ", ": ", " GPU(s) in pool ", "."]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, created_at, *ids])


def _insert_submitted_events_by_orm(
    workload_ids: Sequence[int], *, kind: str, to_state: str, created_at: datetime
) -> None:
    """The framework's path to `insert_submitted_events`' rows: the workloads read, the events `bulk_create`d."""
    submitted = Workload.all_tenants.select_related("owner", "pool").filter(pk__in=list(workload_ids)).order_by("pk")
    WorkloadEvent.all_tenants.bulk_create(
        WorkloadEvent(
            tenant_id=workload.tenant_id,
            workload=workload,
            kind=kind,
            to_state=to_state,
            message=(
                f"Submitted by {workload.owner.get_username()}: "
                f"{workload.gpus_per_replica * workload.replicas} GPU(s) in pool {workload.pool.name}."
            ),
            created_at=created_at,
        )
        for workload in submitted
    )


def record_reasons(rows: Sequence[tuple[str, str, str, int | None, int]], *, pending: str) -> None:
    """Set reason code, message, hint and queue position of each workload of `rows` ((code, message, hint,
    position, workload id), one row per workload) that is still in state `pending`; others keep theirs.

    One parameterized UPDATE, pipelined by the driver (executemany); each locks its row.
    """
    names = ("reason_code", "reason_message", "reason_hint", "queue_position")
    if not fastpaths.enabled(fastpaths.JOBS_SQL):
        _update_pending_by_orm([dict(zip(names, row[:-1], strict=True)) | {"pk": row[-1]} for row in rows], pending)
        return
    assignments = ", ".join(f"{column(Workload, name)} = %s" for name in names)
    where = f"{pk(Workload)} = %s AND {column(Workload, 'state')} = %s"
    sql = f"UPDATE {table(Workload)} SET {assignments} WHERE {where}"  # noqa: S608 -- names from the models' metadata; every value is a parameter
    with connection.cursor() as cursor:
        cursor.executemany(sql, [(*row, pending) for row in rows])


def record_plans(
    rows: Sequence[tuple[datetime | None, str, datetime | None, list[dict[str, Any]], int]], *, pending: str
) -> None:
    """Set estimated start, estimate basis, reserved-from time and reserved GPUs of each workload of `rows`
    ((estimated start, basis, reserved from, reserved GPUs as JSON-able list, workload id), one row per
    workload) that is still in state `pending`; others keep theirs.

    One parameterized UPDATE, pipelined by the driver (executemany); each locks its row.
    """
    names = ("estimated_start_at", "estimate_basis", "reserved_from")
    if not fastpaths.enabled(fastpaths.JOBS_SQL):
        fields = (*names, "reserved_gpus")
        _update_pending_by_orm([dict(zip(fields, row[:-1], strict=True)) | {"pk": row[-1]} for row in rows], pending)
        return
    assignments = [f"{column(Workload, name)} = %s" for name in names]
    as_json = "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"
    assignments.append(f"{column(Workload, 'reserved_gpus')} = {as_json}")
    where = f"{pk(Workload)} = %s AND {column(Workload, 'state')} = %s"
    sql = f"UPDATE {table(Workload)} SET {', '.join(assignments)} WHERE {where}"  # noqa: S608 -- names from the models' metadata; every value is a parameter
    with connection.cursor() as cursor:
        cursor.executemany(
            sql,
            [
                (start, basis, since, json.dumps(held), workload, pending)
                for start, basis, since, held, workload in rows
            ],
        )


def _update_pending_by_orm(rows: Sequence[dict[str, Any]], pending: str) -> None:
    """The framework's path to `record_reasons` and `record_plans`: `bulk_update` of the workloads of `rows`
    (field values by name, and `pk`) that are still in state `pending`."""
    if not rows:
        return
    fields = [name for name in rows[0] if name != "pk"]
    changed = [Workload(**row) for row in rows]
    Workload.all_tenants.filter(state=pending).bulk_update(changed, fields)


def continue_log_chain(
    workload_id: int,
    attempt: int,
    replica: int,
    *,
    since: str,
    cursor: str,
    lines: Sequence[tuple[str, str, str]],
    first_at: datetime,
    last_at: datetime,
    size: int,
) -> int | None:
    """Store `lines` ((timestamp, stream, text), at least one) as the next LogChunk of workload `workload_id`
    if they continue the chain of its replica `replica` of `attempt`; return the chunk's first sequence
    number, or None, writing nothing, when that replica's `log_cursor` is not `since` (a replayed batch)
    or there is no such replica. Postgres only; its caller takes the ORM path instead with `jobs_sql` off.

    The three writes of the ORM path (`jobs.services.logs.chain._store`) as data-modifying CTEs of one
    statement, one round trip (its own transaction outside one): the replica's `log_cursor` moves from
    `since` to `cursor`; the workload's `log_seq` grows by the number of lines; the chunk (the workload's
    tenant, `first_at`, `last_at`, `size` bytes, the statement's timestamp as `created_at`) holds the
    lines as [seq, timestamp, stream, text, attempt, replica], numbered on from the `log_seq` before.
    Locks the replica's row, then the workload's: concurrent batches of its other replicas queue there
    and number on from the committed value.
    """
    params: dict[str, str | int | datetime] = {
        "cursor": cursor,
        "since": since,
        "workload": workload_id,
        "attempt": attempt,
        "replica": replica,
        "count": len(lines),
        "first_at": first_at,
        "last_at": last_at,
        "rows": json.dumps(lines),
        "size": size,
    }
    with connection.cursor() as db:
        db.execute(_log_chain_sql(), params)
        row = db.fetchone()
    return None if row is None else int(row[0])


@cache  # the same statement for every batch
def _log_chain_sql() -> str:
    r = {name: column(Replica, name) for name in ("workload", "attempt", "index", "log_cursor")}
    seq, tenant = column(Workload, "log_seq"), column(Workload, "tenant")
    names = ("tenant", "workload", "first_seq", "last_seq", "first_at", "last_at", "lines", "size_bytes", "created_at")
    chunk_columns = ", ".join(column(LogChunk, name) for name in names)
    chain = (
        f"UPDATE {table(Replica)} SET {r['log_cursor']} = %(cursor)s WHERE {r['workload']} = %(workload)s "  # noqa: S608 -- names from the models' metadata; every value is a parameter
        f"AND {r['attempt']} = %(attempt)s AND {r['index']} = %(replica)s AND {r['log_cursor']} = %(since)s "
        f"RETURNING {r['workload']}"
    )
    numbered = (
        f"UPDATE {table(Workload)} SET {seq} = {seq} + %(count)s "  # noqa: S608 -- names from the models' metadata; every value is a parameter
        f"WHERE {pk(Workload)} IN (SELECT {r['workload']} FROM chain) RETURNING {tenant}, {seq} - %(count)s AS before"
    )
    # The lines as stored: each numbered on from the `log_seq` before, with the batch's attempt and replica.
    stored = (
        "(SELECT jsonb_agg(jsonb_build_array(numbered.before + item.n, item.line->0, item.line->1, item.line->2, "
        "%(attempt)s, %(replica)s) ORDER BY item.n) FROM jsonb_array_elements(%(rows)s::jsonb) "
        "WITH ORDINALITY AS item(line, n))"
    )
    values = (
        f"numbered.{tenant}, %(workload)s, numbered.before + 1, numbered.before + %(count)s, %(first_at)s, "
        f"%(last_at)s, {stored}, %(size)s, statement_timestamp()"
    )
    return (
        f"WITH chain AS ({chain}), numbered AS ({numbered}) "  # noqa: S608 -- names from the models' metadata; every value is a parameter
        f"INSERT INTO {table(LogChunk)} ({chunk_columns}) SELECT {values} FROM numbered "
        f"RETURNING {column(LogChunk, 'first_seq')}"
    )
