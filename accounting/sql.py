"""SQL the ORM has no portable spelling for: the seconds between two times, as a float, on Postgres and SQLite."""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import FloatField, Func
from django.db.models.sql.compiler import SQLCompiler


class SecondsBetween(Func):
    """`SecondsBetween(later, earlier)`: seconds from `earlier` to `later` (negative when reversed), a float.

    Exact to the microsecond on both: Postgres subtracts timestamps; on SQLite
    this is Django's own timestamp difference (integer microseconds), because
    julianday() drifts by up to 50 µs per row and a month's sum by milliseconds.
    """

    arity = 2
    output_field = FloatField()

    def as_postgresql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any) -> Any:
        return self.as_sql(
            compiler,
            connection,
            template="CAST(EXTRACT(EPOCH FROM (%(expressions)s)) AS double precision)",
            arg_joiner=" - ",
            **extra,
        )

    def as_sqlite(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any) -> Any:
        return self.as_sql(
            compiler,
            connection,
            template="(django_timestamp_diff(%(expressions)s) / 1000000.0)",
            **extra,
        )
