"""The tenants app's hand-written SQL: the API token lookup that every token-authenticated request makes.

Written out rather than built by the ORM because compiling the equivalent
queryset (`select_related` of owner and tenant, a subquery for the owner's
role) costs several times the query's round trip: on Postgres, one token
took 1.1 ms through the ORM against 0.4 ms here. Table and column names come
from the models' metadata (`common.sql`); every value is a parameter.
tests/tenants/test_fast_sql.py holds each function to an ORM query computing the
same thing, on SQLite and Postgres.

A fast path (docs/fastpaths.md): `GPUCLOUD_FAST_PATHS_OFF=token_sql` turns
it off, and `tokens_with_role` is that ORM query (`_tokens_with_role_by_orm`).
Justified by `bench/submissions.py --floor` (token-authenticated GETs a
second) and, per lookup, by the figures above. It depends on these
framework internals: `Model.from_db`, the backend's and each column's db
converters (`get_db_converters`), `_meta.concrete_fields`
in column order, and `_state.fields_cache` filled by setting the relations.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from django.db.models import OuterRef, Subquery
from django.db.models.expressions import Col

from common import fastpaths
from common.sql import column, fetch, pk, placeholders, table
from tenants.models import ApiToken, Membership, Tenant

# The models a token is loaded with, in the order of the query's columns, and their aliases there.
_LOADED = (ApiToken, User, Tenant)
_ALIASES = "tuo"


def tokens_with_role(field: str, values: Sequence[Any]) -> list[tuple[ApiToken, str | None]]:
    """Return the tokens whose field `field` (`prefix` or `id`) is one of `values`, each with its owner
    (`user`) and its tenant (`tenant`, when it has one) loaded, paired with the owner's membership role in
    the token's tenant (None when the owner is no member there, or the token has no tenant).

    One query; locks nothing; in no particular order.
    """
    if not values:
        return []
    if not fastpaths.enabled(fastpaths.TOKEN_SQL):
        return _tokens_with_role_by_orm(field, values)
    rows = fetch(_token_query(field, len(values)), list(values))
    converters = _converters()
    found = []
    for row in rows:
        converted = list(row[:-1])
        for index, (col, functions) in enumerate(converters):
            for function in functions:
                converted[index] = function(converted[index], col, connection)
        found.append((_token_from(converted), row[-1]))
    return found


def _tokens_with_role_by_orm(field: str, values: Sequence[Any]) -> list[tuple[ApiToken, str | None]]:
    """The framework's path to `tokens_with_role`'s answer: the queryset the statement is held to."""
    role = Membership.all_tenants.filter(tenant_id=OuterRef("tenant_id"), user_id=OuterRef("user_id")).values("role")
    found = (
        ApiToken.all_tenants.select_related("user", "tenant")
        .annotate(owner_role=Subquery(role[:1]))
        .filter(**{f"{field}__in": list(values)})
    )
    return [(token, token.owner_role) for token in found]


# Built once per shape: spelling out the three models' columns (30 us) is several percent of the lookup.
@lru_cache(maxsize=64)
def _token_query(field: str, count: int) -> str:
    quote = connection.ops.quote_name
    aliased = zip(_LOADED, _ALIASES, strict=True)
    columns = ", ".join(f"{alias}.{quote(f.column)}" for model, alias in aliased for f in model._meta.concrete_fields)
    token_tenant, token_user = column(ApiToken, "tenant"), column(ApiToken, "user")
    of_owner = (
        f"m.{column(Membership, 'tenant')} = t.{token_tenant} AND m.{column(Membership, 'user')} = t.{token_user}"
    )
    role = f"(SELECT m.{column(Membership, 'role')} FROM {table(Membership)} m WHERE {of_owner} LIMIT 1)"  # noqa: S608 -- names from the models' metadata
    tables = (
        f"{table(ApiToken)} t JOIN {table(User)} u ON u.{pk(User)} = t.{token_user} "
        f"LEFT JOIN {table(Tenant)} o ON o.{pk(Tenant)} = t.{token_tenant}"
    )
    where = f"t.{column(ApiToken, field)} IN ({placeholders(count)})"
    return f"SELECT {columns}, {role} FROM {tables} WHERE {where}"  # noqa: S608 -- names from the models' metadata; every value is a parameter


def _converters() -> list[tuple[Col, list[Any]]]:
    """Return each loaded column's expression and the converters the ORM would apply to its value."""
    columns = [f.get_col(m._meta.db_table) for m in _LOADED for f in m._meta.concrete_fields]
    return [(col, connection.ops.get_db_converters(col) + col.get_db_converters(connection)) for col in columns]


def _token_from(values: list[Any]) -> ApiToken:
    loaded = []
    start = 0
    for model in _LOADED:
        fields = model._meta.concrete_fields
        chunk = values[start : start + len(fields)]
        start += len(fields)
        loaded.append(None if chunk[0] is None else model.from_db(connection.alias, [f.attname for f in fields], chunk))
    token, user, tenant = loaded
    assert isinstance(token, ApiToken) and isinstance(user, User)
    token.user = user
    if isinstance(tenant, Tenant):
        token.tenant = tenant
    return token
