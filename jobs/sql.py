"""The jobs app's hand-written SQL: the reads every submission makes, its event insert, the scheduler's reasons and
plans, the notebook proxy's access read and the log chain's one-statement write.

Written out rather than built by the ORM because the ORM was slower by far
more than a few percent. Medians on Postgres (scratch database: 1,000 GPUs
on 125 nodes, 5,000 workloads, 32 submissions' worth of keys), here
against the closest ORM form:

- allowed images of 3 tenants: 0.15 ms against 0.51 ms (Q objects, Subquery);
- quota limits of 32 pairs, locked: 0.9 ms against 4.3 ms (1 pair: 0.5 against
  1.8), the tenant's limits as three subqueries and `select_for_update(of=...)`;
- GPU counts of 4 pools: 0.6 ms against 1.1 ms;
- pending counts of 32 keys: 0.58 ms against 0.68 ms even in the ORM's best
  form (`__in` on both columns, the pairs picked in Python), 3 ms OR-ing
  the pairs; notebook counts 0.9 ms against 4 ms;
- 32 submitted events: 0.7 ms against 1.3 ms with `bulk_create` (1,000:
  5 ms against 27 ms);
- reasons of 32 waiting workloads: 2.6 ms against 12 ms with `bulk_update`,
  which builds a CASE expression per row and field (1,000: 0.13 s against 0.7 s);
  start estimates and reservations (`record_plans`) are written the same way;
- the proxy's access read (5,000 workloads of 20 tenants, 200 members), asked on
  every proxied request: 0.36 ms against 2.0 ms (Exists, Subquery, `first()`),
  the difference all the ORM building and compiling the queryset;
- a log batch stored (Postgres only): one round trip, where the ORM path
  (`jobs.services.logs.chain._store`) makes four statements and a commit.

Table and column names come from the models' metadata (`common.sql`);
every value is a parameter. tests/jobs/test_sql.py holds each function to
an ORM query or write computing the same thing, on SQLite and Postgres
(the log chain's on Postgres only).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from django.contrib.auth.models import User
from django.db import connection

from common.sql import column, fetch, is_in, pk, placeholders, table
from inventory.models import Gpu, Node, NodePool
from jobs.models import AllowedImage, LogChunk, Replica, Workload, WorkloadEvent
from tenants.models import Membership, ProjectQuota, Tenant, TenantQuota

# The count limits a quota row holds, as the project's and then the tenant's columns of `quota_limits`.
LIMIT_FIELDS = ("max_pending_workloads", "max_notebooks_per_user", "max_runtime_seconds")


def allowed_image_rows(tenant_ids: Collection[int]) -> list[tuple[int | None, str, bool]]:
    """Return (tenant id, pattern, notebook) of the allowed images of `tenant_ids` (at least one), of the
    platform-wide ones (tenant id None), and of the platform's first pattern whoever's it is, so that the
    result is empty exactly when the platform has no pattern at all.

    One query; locks nothing; in no particular order.
    """
    tenant, pattern, notebook = (column(AllowedImage, name) for name in ("tenant", "pattern", "notebook"))
    first = f"SELECT MIN({pk(AllowedImage)}) FROM {table(AllowedImage)}"  # noqa: S608 -- names from the models' metadata
    where = f"{tenant} IN ({placeholders(len(tenant_ids))}) OR {tenant} IS NULL OR {pk(AllowedImage)} = ({first})"
    sql = f"SELECT {tenant}, {pattern}, {notebook} FROM {table(AllowedImage)} WHERE {where}"  # noqa: S608 -- names from the models' metadata; every value is a parameter
    return [(owner, text, bool(serves)) for owner, text, serves in fetch(sql, list(tenant_ids))]


def quota_limits(keys: Sequence[tuple[int, int]], *, lock: bool) -> list[tuple[Any, ...]]:
    """Return the project quota rows of these (project id, pool id) pairs (at least one) as (project id,
    pool id, limit, then the project's and the tenant's LIMIT_FIELDS in that pool), the tenant's None
    where it has no quota there; a pair without a project quota is left out.

    Ordered by project, then pool. With `lock`, locks the project quota rows (FOR UPDATE, in that order,
    so lockers never deadlock), never the tenant's, which are read as they stand, as the scheduler reads
    them; SQLite has no row locks (its writers take turns anyway).
    """
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


def gpu_counts(pool_ids: Collection[int], *, failed: str, gone_node_states: Collection[str]) -> list[tuple[Any, ...]]:
    """Return (pool id, node id, GPU model, count) of the present GPUs of `pool_ids` (at least one) whose
    health is not `failed`, on nodes of those pools in no state of `gone_node_states`.

    One query; locks nothing; in no particular order.
    """
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


def pending_counts(keys: Collection[tuple[int, int]], *, pending: str) -> dict[tuple[int, int], int]:
    """Return the number of workloads in state `pending` per (project id, pool id) of `keys` (at least one);
    a key with none is left out. One query (the partial index `workload_pending_per_project` serves it);
    locks nothing."""
    return _counts(("project", "pool"), keys, {"state": [pending]})


def notebook_counts(
    keys: Collection[tuple[int, int, int]], *, notebook: str, states: Collection[str]
) -> dict[tuple[int, int, int], int]:
    """Return the number of workloads of kind `notebook` in one of `states` per (project id, owner id,
    pool id) of `keys` (at least one); a key with none is left out. One query (the partial index
    `workload_live_notebooks` serves it); locks nothing."""
    return _counts(("project", "owner", "pool"), keys, {"kind": [notebook], "state": list(states)})


def _counts(fields: tuple[str, ...], keys: Collection[tuple[int, ...]], where: dict[str, list[str]]) -> dict[Any, int]:
    grouped = ", ".join(column(Workload, name) for name in fields)
    conditions = [f"{column(Workload, name)} IN ({placeholders(len(values))})" for name, values in where.items()]
    row = f"({placeholders(len(fields))})"
    conditions.append(f"({grouped}) IN ({', '.join([row] * len(keys))})")
    sql = f"SELECT {grouped}, COUNT(*) FROM {table(Workload)} WHERE {' AND '.join(conditions)} GROUP BY {grouped}"  # noqa: S608 -- names from the models' metadata; every value is a parameter
    params = [*(value for values in where.values() for value in values), *(v for key in sorted(keys) for v in key)]
    return {tuple(row[:-1]): row[-1] for row in fetch(sql, params)}


def insert_submitted_events(workload_ids: Sequence[int], *, kind: str, to_state: str, created_at: datetime) -> None:
    """Insert one WorkloadEvent of `kind` into `to_state` for each workload of `workload_ids`, in workload id
    order, with the workload's tenant and the message "Submitted by <owner's username>: <GPUs per replica
    times replicas> GPU(s) in pool <pool name>."; one INSERT ... SELECT from the workload rows.

    Locks nothing beyond the rows it inserts.
    """
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


def record_reasons(rows: Sequence[tuple[str, str, str, int | None, int]], *, pending: str) -> None:
    """Set reason code, message, hint and queue position of each workload of `rows` ((code, message, hint,
    position, workload id), one row per workload) that is still in state `pending`; others keep theirs.

    One parameterized UPDATE, pipelined by the driver (executemany); each locks its row.
    """
    names = ("reason_code", "reason_message", "reason_hint", "queue_position")
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


def notebook_session(
    workload_id: int, user_id: int, *, notebook: str, live: Sequence[str], owner_roles: Sequence[str], admin: str
) -> tuple[str, str | None] | None:
    """Return (session secret, endpoint) of workload `workload_id` when user `user_id` may reach it, else None.

    It must be of kind `notebook`, in one of `live` states, with a session secret, in an active tenant,
    and the user its owner holding one of `owner_roles` in its tenant, or holding `admin` there. The
    endpoint is that of replica 0 of the workload's current attempt; None while that has reported none.

    One query, across tenants; locks nothing.
    """
    sql = _notebook_session_sql(len(live), len(owner_roles))
    rows = fetch(sql, [workload_id, notebook, *live, True, user_id, user_id, *owner_roles, user_id, admin])
    return (rows[0][0], rows[0][1]) if rows else None


# Built once per shape: the notebook proxy asks on every request it serves (each file, each chunk of a download).
@cache
def _notebook_session_sql(live: int, owner_roles: int) -> str:
    w = {name: f"w.{column(Workload, name)}" for name in ("tenant", "owner", "kind", "state", "attempt")}
    secret, workload_id = f"w.{column(Workload, 'session_secret')}", f"w.{pk(Workload)}"
    endpoint = f"r.{column(Replica, 'endpoint')}"
    of_replica = (
        f"r.{column(Replica, 'workload')} = {workload_id} AND r.{column(Replica, 'attempt')} = {w['attempt']} "
        f"AND r.{column(Replica, 'index')} = 0 AND {endpoint} <> ''"
    )
    first_endpoint = f"(SELECT {endpoint} FROM {table(Replica)} r WHERE {of_replica} LIMIT 1)"  # noqa: S608 -- names from the models' metadata
    member = (
        f"SELECT 1 FROM {table(Membership)} m WHERE m.{column(Membership, 'tenant')} = {w['tenant']} "  # noqa: S608 -- names from the models' metadata; every value is a parameter
        f"AND m.{column(Membership, 'user')} = %s AND m.{column(Membership, 'role')}"
    )
    where = (
        f"{workload_id} = %s AND {w['kind']} = %s AND {w['state']} IN ({placeholders(live)}) "
        f"AND {secret} <> '' AND t.{column(Tenant, 'is_active')} = %s "
        f"AND (({w['owner']} = %s AND EXISTS ({member} IN ({placeholders(owner_roles)}))) "
        f"OR EXISTS ({member} = %s))"
    )
    tables = f"{table(Workload)} w JOIN {table(Tenant)} t ON t.{pk(Tenant)} = {w['tenant']}"
    return f"SELECT {secret}, {first_endpoint} FROM {tables} WHERE {where}"  # noqa: S608 -- names from the models' metadata; every value is a parameter


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
    or there is no such replica. Postgres only.

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
