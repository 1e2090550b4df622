"""The inventory app's hand-written SQL: the telemetry writes of every batch of agent reports.

A fast path (docs/fastpaths.md): `GPUCLOUD_FAST_PATHS_OFF=telemetry_sql`
turns it off, and each function here writes through its ORM form beside
it (`_<name>_by_orm`), leaving the same rows. Its benchmark is
`bench/fast_sql.py`, each statement timed with the switch on and off
(docs/fastpaths.md has the figures: from 33 to 127 times faster than its
ORM form); the path they serve is measured by `bench/telemetry_ingest.py`
(8,000 GPUs reporting at 1 Hz: the controller's CPU and the rollups'
delay). The figures below are what each statement was written for.

Written out rather than built by the ORM because a batch covers every GPU
of the nodes that reported, and the ORM's ways of writing many rows are
far slower: `bulk_update` builds a CASE expression per row and field (on
Postgres, 1,000 GPUs' samples took 0.55 s through it against 16 ms here;
125 nodes' replay marks 20 ms against 1.4 ms), and no ORM upsert adds to
the row it conflicts with, as the rollups' merge must (the ORM form reads
each minute locked and updates or creates it: a statement or two per row).
Each function has a Postgres variant (the rows travel as one JSON document
or as arrays, in one statement) and one for SQLite (a parameterized
executemany).

It depends on these framework internals: `_meta` (`db_table`, each
field's `column` and `db_type`), each field's `get_db_prep_value` (the
SQLite variants prepare datetimes as the ORM would), the backend's
`quote_name`, and the driver's `executemany`. Table and column names, and
the Postgres types of the values, come from the models' metadata
(`common.sql`); every value is a parameter. tests/inventory/test_fast_sql.py
runs each function with the switch on and off and compares the rows, on
SQLite and Postgres.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Model, Value
from django.db.models.functions import Coalesce, Greatest

from common import fastpaths
from common.sql import column, field, pk, pk_field, placeholders, table
from inventory.models import Gpu, GpuMinute, Node

# The rollup fields `merge_gpu_minutes` writes, in the order of its rows; the minute travels as epoch seconds.
MINUTE_FIELDS = (
    "gpu",
    "minute",
    "samples",
    "utilization_sum",
    "utilization_max",
    "memory_used_max_mib",
    "power_samples",
    "power_sum",
    "temperature_max",
)
# How a merge combines a partial with the minute already stored: these add up, the others take the greater.
_ADDED = ("samples", "utilization_sum", "power_samples", "power_sum")
_GREATEST = ("utilization_max", "memory_used_max_mib", "temperature_max")
_SAMPLE_FIELDS = ("utilization", "memory_used_mib", "last_sample")

Sample = tuple[float | None, int | None, dict[str, Any]]
"""(utilization, memory used in MiB, the sample as reported) of one GPU."""


def _db_type(model: type[Model], name: str | None = None) -> str:
    """Return the Postgres type of the model's field `name` (its primary key when None), which its values
    are cast to (a foreign key's is its target's: `bigint`)."""
    db_type = (pk_field(model) if name is None else field(model, name)).db_type(connection)
    assert db_type is not None  # every field here has a column
    return db_type


def store_gpu_samples(latest: Mapping[int, Sample], at: datetime) -> None:
    """Set utilization, memory used, last sample and `last_sample_at` = `at` of each GPU in `latest`
    (by GPU id); locks the GPUs' rows.

    On Postgres the rows travel as one JSON document into one UPDATE ...
    FROM jsonb_to_recordset: a pipelined executemany cost ~100 us per GPU,
    and an array of JSON texts as much again in the driver's quoting.
    Elsewhere a parameterized executemany.
    """
    if not fastpaths.enabled(fastpaths.TELEMETRY_SQL):
        _store_gpu_samples_by_orm(latest, at)
        return
    gpu_table, gpu_pk = table(Gpu), pk(Gpu)
    stamp = column(Gpu, "last_sample_at")
    when = Gpu._meta.get_field("last_sample_at").get_db_prep_value(at, connection)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            names = [pk_field(Gpu).column, *(field(Gpu, name).column for name in _SAMPLE_FIELDS)]
            document = [dict(zip(names, (gpu_id, *values), strict=True)) for gpu_id, values in latest.items()]
            types = [_db_type(Gpu), *(_db_type(Gpu, name) for name in _SAMPLE_FIELDS)]
            record = ", ".join(f"{connection.ops.quote_name(n)} {t}" for n, t in zip(names, types, strict=True))
            sets = ", ".join(f"{column(Gpu, name)} = v.{column(Gpu, name)}" for name in _SAMPLE_FIELDS)
            cursor.execute(
                f"UPDATE {gpu_table} SET {sets}, {stamp} = %s FROM jsonb_to_recordset(%s::jsonb) AS v({record}) "  # noqa: S608 -- names and types from the models' metadata; every value is a parameter
                f"WHERE {gpu_table}.{gpu_pk} = v.{gpu_pk}",
                [when, json.dumps(document)],
            )
        else:
            sets = ", ".join(f"{column(Gpu, name)} = %s" for name in _SAMPLE_FIELDS)
            cursor.executemany(
                f"UPDATE {gpu_table} SET {sets}, {stamp} = %s WHERE {gpu_pk} = %s",  # noqa: S608 -- names from the models' metadata; every value is a parameter
                [(u, m, json.dumps(s), when, gpu_id) for gpu_id, (u, m, s) in latest.items()],
            )


def _store_gpu_samples_by_orm(latest: Mapping[int, Sample], at: datetime) -> None:
    """The framework's path to `store_gpu_samples`' rows: one `bulk_update`."""
    changed = [
        Gpu(pk=gpu_id, utilization=utilization, memory_used_mib=memory, last_sample=sample, last_sample_at=at)
        for gpu_id, (utilization, memory, sample) in latest.items()
    ]
    Gpu.objects.bulk_update(changed, [*_SAMPLE_FIELDS, "last_sample_at"])


def merge_gpu_minutes(rows: Sequence[tuple[Any, ...]]) -> None:
    """Upsert rollup partials, each a row of MINUTE_FIELDS' values (the minute as epoch seconds), into
    GpuMinute: a new (GPU, minute) is inserted; on an existing one sums and counts add up and maxima take
    the greater known value. One statement on Postgres, an executemany elsewhere.

    Locks the minutes' rows in the order of `rows`: give them in (GPU, minute) order, so concurrent merges
    never deadlock each other.
    """
    if not fastpaths.enabled(fastpaths.TELEMETRY_SQL):
        _merge_gpu_minutes_by_orm(rows)
        return
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_merge_sql("postgresql"), [list(values) for values in zip(*rows, strict=True)])
        return
    minute = GpuMinute._meta.get_field("minute")
    prepared = [
        (row[0], minute.get_db_prep_value(datetime.fromtimestamp(row[1], UTC), connection), *row[2:]) for row in rows
    ]
    with connection.cursor() as cursor:
        cursor.executemany(_merge_sql(connection.vendor), prepared)


@transaction.atomic
def _merge_gpu_minutes_by_orm(rows: Sequence[tuple[Any, ...]]) -> None:
    """The framework's path to `merge_gpu_minutes`' rows: each minute created, or locked and updated in place."""
    for gpu_id, epoch, *values in rows:
        partial = dict(zip(MINUTE_FIELDS[2:], values, strict=True))
        stored, created = GpuMinute.objects.select_for_update().get_or_create(
            gpu_id=gpu_id, minute=datetime.fromtimestamp(epoch, UTC), defaults=partial
        )
        if created:
            continue
        # Sums in the database (the row is locked); a maximum only where the partial knows one.
        merged: dict[str, Any] = {name: F(name) + partial[name] for name in _ADDED}
        merged |= {
            name: _greater(name, Value(partial[name], output_field=field(GpuMinute, name)))
            for name in _GREATEST
            if partial[name] is not None
        }
        GpuMinute.objects.filter(pk=stored.pk).update(**merged)


def _greater(name: str, value: Value) -> Greatest:
    """Return the greater of the field `name` and `value`, `value` where the field is unset."""
    return Greatest(Coalesce(F(name), value), value)


@cache  # the same statement for every batch
def _merge_sql(vendor: str) -> str:
    minutes = table(GpuMinute)
    columns = [column(GpuMinute, name) for name in MINUTE_FIELDS]
    greatest = "GREATEST({0}, {1})" if vendor == "postgresql" else "MAX(COALESCE({0}, {1}), COALESCE({1}, {0}))"
    updates = [f"{c} = {minutes}.{c} + excluded.{c}" for c in (column(GpuMinute, name) for name in _ADDED)]
    updates += [
        f"{c} = {greatest.format(f'{minutes}.{c}', f'excluded.{c}')}"
        for c in (column(GpuMinute, name) for name in _GREATEST)
    ]
    if vendor == "postgresql":
        # One statement whatever the batch's size: each column travels as one array.
        types = ["double precision" if name == "minute" else _db_type(GpuMinute, name) for name in MINUTE_FIELDS]
        arrays = ", ".join(f"%s::{kind}[]" for kind in types)
        minute = column(GpuMinute, "minute")
        values = ", ".join(f"to_timestamp(u.{c})" if c == minute else f"u.{c}" for c in columns)
        source = f"SELECT {values} FROM unnest({arrays}) AS u({', '.join(columns)})"  # noqa: S608 -- names and types from the models' metadata; every value is a parameter
    else:
        source = f"VALUES ({placeholders(len(columns))})"
    conflict = ", ".join(column(GpuMinute, name) for name in ("gpu", "minute"))
    return (
        f"INSERT INTO {minutes} ({', '.join(columns)}) {source} "
        f"ON CONFLICT ({conflict}) DO UPDATE SET {', '.join(updates)}"
    )


def advance_rollup_marks(newest: Mapping[int, float]) -> None:
    """Set each node's `samples_rolled_up_until` (by node id in `newest`) to the greater of its mark and the
    given timestamp, an unset mark to the timestamp. One statement on Postgres, an executemany elsewhere;
    locks the nodes' rows."""
    if not fastpaths.enabled(fastpaths.TELEMETRY_SQL):
        _advance_rollup_marks_by_orm(newest)
        return
    nodes, node_pk, mark = table(Node), pk(Node), column(Node, "samples_rolled_up_until")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            types = f"%s::{_db_type(Node)}[], %s::{_db_type(Node, 'samples_rolled_up_until')}[]"
            cursor.execute(
                f"UPDATE {nodes} SET {mark} = GREATEST({nodes}.{mark}, v.until) "  # noqa: S608 -- names and types from the models' metadata; every value is a parameter
                f"FROM unnest({types}) AS v(id, until) WHERE {nodes}.{node_pk} = v.id",
                [list(newest), list(newest.values())],
            )
        else:
            cursor.executemany(
                f"UPDATE {nodes} SET {mark} = MAX(COALESCE({mark}, %s), %s) WHERE {node_pk} = %s",  # noqa: S608 -- names from the models' metadata; every value is a parameter
                [(until, until, node_id) for node_id, until in newest.items()],
            )


def _advance_rollup_marks_by_orm(newest: Mapping[int, float]) -> None:
    """The framework's path to `advance_rollup_marks`' rows: an update per node (no `bulk_update` takes the greater)."""
    for node_id, until in newest.items():
        mark = _greater("samples_rolled_up_until", Value(until, output_field=field(Node, "samples_rolled_up_until")))
        Node.objects.filter(pk=node_id).update(samples_rolled_up_until=mark)
