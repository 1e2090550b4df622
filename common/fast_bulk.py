"""Insert many new model instances in one statement, cheaply: the submission path's writes.

`insert` does what `bulk_create` does for a list of new instances of one
model (defaults and `auto_now` fields filled in, primary keys set from the
database) in one statement. On Postgres the rows travel as one JSON array
of rows, expanded in SQL by `jsonb_array_elements ... WITH ORDINALITY` and
each element cast to its column's type: Django's own bulk insert prepares
every value of every field in Python (and psycopg then dumps each column as
an array), which cost about 0.3 ms per workload row, more than the rest of
its submission. Elsewhere (SQLite) it is `bulk_create`.

Only plain values are supported: text, numbers, booleans, dates and times,
JSON fields, foreign keys, IP addresses, and None. `insert` and `new` raise
TypeError for a model with any other field type (binary, UUID, decimals) on
every database, so a model the Postgres path would refuse is refused by the
SQLite test run too, rather than risk a wrong conversion.

A fast path (docs/fastpaths.md): `GPUCLOUD_FAST_PATHS_OFF=bulk_instances`
turns it off, and `insert` is `bulk_create`, `new` is `Model(**values)`,
on every database (the unsupported-field check stays). Justified by
`bench/submissions.py` (bulk submissions, workloads a second). It depends
on these framework internals: `Model.__new__` plus a fresh `ModelState`
in `_state` and the attribute names `Model.__init__` sets (`new`), and
`Field.pre_save`, `Field.db_type` and `connection.ops.quote_name` for the
statement (`insert`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from operator import attrgetter
from typing import Any, TypeVar

from django.db import connection, models
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from common import fastpaths

M = TypeVar("M", bound=models.Model)

# Types whose Python values JSON carries as they are (an IP address is a string here).
_PLAIN = (
    models.CharField,
    models.TextField,
    models.IntegerField,  # the small, big and positive ones too
    models.BooleanField,
    models.DateTimeField,
    models.DateField,
    models.TimeField,
    models.JSONField,
    models.ForeignKey,
    models.FloatField,
    models.GenericIPAddressField,
)


def insert(objs: Sequence[M]) -> list[M]:
    """Insert new instances of one model in one statement and return them, primary keys set.

    The same contract as `Model.objects.bulk_create(objs)` for instances
    without primary keys: no signals, no `save()`, rows in the given order.
    Raises TypeError, on every database, when the model has a field that is
    not a plain value (see the module's docstring).
    """
    if not objs:
        return list(objs)
    model = type(objs[0])
    plan = _plan(model)  # refuses an unsupported field before the vendor or the switch decides the path
    if connection.vendor != "postgresql" or not fastpaths.enabled(fastpaths.BULK_INSTANCES):
        return model._base_manager.bulk_create(objs)
    for obj in objs:
        for field in plan.stamped:
            field.pre_save(obj, True)
    rows = json.dumps([plan.row(obj) for obj in objs])
    with connection.cursor() as cursor:
        cursor.execute(plan.sql, [rows])
        ids = [row[0] for row in cursor.fetchall()]
    for obj, pk_value in zip(objs, ids, strict=True):
        setattr(obj, plan.pk, pk_value)
        obj._state.adding = False
        obj._state.db = connection.alias
    return list(objs)


def new(model: type[M], values: dict[str, Any]) -> M:
    """Return an unsaved instance of `model` with `values` by attribute name (`project_id`, not `project`)
    and every other field at its default: what `model(**values)` gives.

    Built as `Model.__init__` builds it (a fresh `ModelState`, each field's
    attribute set) without its per-field machinery, which took a third of a
    bulk submission's time; through the constructor whenever anything
    listens to `pre_init` or `post_init` for the model.
    """
    plan = _plan(model)
    if not values.keys() <= plan.names:
        raise TypeError(f"{model.__name__} has no fields {', '.join(sorted(values.keys() - plan.names))}")
    if not fastpaths.enabled(fastpaths.BULK_INSTANCES):
        return model(**values)  # the framework's own path: the fast one's contract, by definition
    if pre_init.has_listeners(model) or post_init.has_listeners(model):
        return model(*[values[name] if name in values else default() for name, default in plan.defaults])
    obj = model.__new__(model)
    attributes = {name: values[name] if name in values else default() for name, default in plan.defaults}
    attributes["_state"] = ModelState()
    obj.__dict__.update(attributes)
    return obj


@dataclass(frozen=True)
class _Plan:
    sql: str
    values: Callable[[Any], Any]
    stamped: list[models.Field[Any, Any]]
    pk: str
    defaults: list[tuple[str, Callable[[], Any]]]
    names: frozenset[str]
    # Positions of the date and time fields (sent as ISO text) and of those whose values Django normalises
    # before saving (an IP address: "" is NULL), in a row.
    temporal: list[int]
    prepared: list[tuple[int, models.Field[Any, Any]]]

    def row(self, obj: models.Model) -> list[Any]:
        """Return the instance's row: every field's value, read at once (in C), dates and times as ISO text."""
        values = list(self.values(obj))
        for index in self.temporal:
            if values[index] is not None:
                values[index] = values[index].isoformat()
        for index, field in self.prepared:
            values[index] = field.get_prep_value(values[index]) or None  # Django stores a blank address as NULL
        return values


@cache
def _plan(model: type[models.Model]) -> _Plan:
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    unsupported = [f.name for f in fields if not isinstance(f, _PLAIN)]
    if unsupported:
        raise TypeError(f"common.fast_bulk cannot carry {model.__name__}.{', '.join(unsupported)} as JSON")
    pk = model._meta.pk
    assert pk is not None
    return _Plan(
        sql=_sql(model, fields, pk),
        values=attrgetter(*(f.attname for f in fields)),
        stamped=[f for f in fields if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)],
        pk=pk.attname,
        defaults=[(f.attname, _default(f)) for f in model._meta.concrete_fields],
        names=frozenset(f.attname for f in model._meta.concrete_fields),
        temporal=[i for i, f in enumerate(fields) if isinstance(f, models.DateField | models.TimeField)],
        prepared=[(i, f) for i, f in enumerate(fields) if isinstance(f, models.GenericIPAddressField)],
    )


def _default(field: models.Field[Any, Any]) -> Callable[[], Any]:
    if field.primary_key:
        return lambda: None
    return field.get_default


def _sql(model: type[models.Model], fields: list[models.Field[Any, Any]], pk: models.Field[Any, Any]) -> str:
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in fields)
    values = ", ".join(_element(index, f) for index, f in enumerate(fields))
    # The ordinality keeps the rows (and so the returned ids) in the order given.
    source = "jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS r(value, position)"
    select = f"SELECT {values} FROM {source} ORDER BY r.position"  # noqa: S608 -- names from the models' metadata; the rows are one parameter
    return f"INSERT INTO {quote(model._meta.db_table)} ({columns}) {select} RETURNING {quote(pk.column)}"


def _element(index: int, field: models.Field[Any, Any]) -> str:
    """Return the SQL reading a row's `index`th element as the field's column type."""
    if isinstance(field, models.JSONField):
        return f"NULLIF(r.value -> {index}, 'null'::jsonb)"  # None is SQL NULL, as Django stores it
    # ->> gives the element as text (SQL NULL for a JSON null), which the column's type then parses. Text
    # stays text: a cast to varchar(n) would cut a long value short, where the column refuses it.
    db_type = "text" if isinstance(field, models.CharField | models.TextField) else field.db_type(connection)
    assert db_type is not None  # a foreign key's is its target's (bigint), without constraints
    return f"(r.value ->> {index})::{db_type}"
