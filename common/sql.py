"""The pieces each app's hand-written SQL (`tenants.fast_sql`, `jobs.fast_sql`, `inventory.fast_sql`) is built from.

Table and column names come from the models' metadata, quoted by the
backend, so a statement follows its models' fields and no name is typed
by hand; values are always parameters. Nothing here runs a statement of
its own but `fetch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Field, Model


def table(model: type[Model]) -> str:
    """Return the model's table name, quoted."""
    return connection.ops.quote_name(model._meta.db_table)


def field(model: type[Model], name: str) -> Field[Any, Any]:
    """Return the model's concrete field `name`; raise TypeError for a relation's reverse side or the like."""
    found = model._meta.get_field(name)
    if not isinstance(found, Field) or not found.column:
        raise TypeError(f"{model.__name__}.{name} has no column")
    return found


def column(model: type[Model], name: str) -> str:
    """Return the column of the model's field `name` (`tenant` gives `"tenant_id"`), quoted."""
    return connection.ops.quote_name(field(model, name).column)


def pk_field(model: type[Model]) -> Field[Any, Any]:
    """Return the model's primary key field."""
    assert model._meta.pk is not None  # every concrete model has one
    return model._meta.pk


def pk(model: type[Model]) -> str:
    """Return the column of the model's primary key, quoted."""
    return connection.ops.quote_name(pk_field(model).column)


def placeholders(count: int) -> str:
    """Return `%s, %s, ...` for an IN list of `count` values."""
    return ", ".join(["%s"] * count)


def is_in(column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
    """Return the condition that `column` is one of `values`, and its parameters.

    On Postgres one array parameter, whatever the count: a thousand
    placeholders cost more to send and parse than the statement's work.
    """
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)", [list(values)]
    return f"{column} IN ({placeholders(len(values))})", list(values)


def fetch(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Return the rows of one read-only statement on the default database."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())
