"""tenants.fast_sql against the ORM: the token lookup returns what the equivalent queryset does, over generated rows.

The queryset is the fast path's own fallback (`FAST_PATHS["token_sql"]` off), so the same call is compared
with its switch on and off.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Model
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from common import fastpaths
from tenants import fast_sql
from tenants.choices import Role
from tenants.models import ApiToken, Membership, Tenant
from tests.examples import SQL_EXAMPLES, moments, rolled_back, texts

pytestmark = pytest.mark.django_db

MEMBER_ROLES = [Role.VIEWER, Role.MEMBER, Role.ADMIN]

tokens = st.lists(
    st.fixed_dictionaries(
        {
            "user": st.integers(0, 2),
            "tenant": st.none() | st.integers(0, 1),  # None: an operator token
            "role": st.sampled_from(MEMBER_ROLES),
            "expires_at": moments,
            "last_used_at": st.none() | moments,
            "revoked_at": st.none() | moments,
            "name": texts,
        }
    ),
    max_size=6,
)


def _fields(obj: Model | None) -> list[Any] | None:
    return None if obj is None else [getattr(obj, f.attname) for f in obj._meta.concrete_fields]


def _loaded(token: ApiToken, role: str | None) -> tuple[Any, ...]:
    assert "user" in token._state.fields_cache  # loaded with the token, not fetched when read
    tenant = token.tenant if token.tenant_id is not None else None
    return (_fields(token), _fields(token.user), _fields(tenant), role)


def _with_role(field: str, values: list[Any], *, fast: bool) -> list[tuple[Any, ...]]:
    """Return what `tokens_with_role` loads with the fast path's switch `fast` (off: the ORM queryset)."""
    with override_settings(FAST_PATHS={**settings.FAST_PATHS, fastpaths.TOKEN_SQL: fast}):
        return sorted((_loaded(token, role) for token, role in fast_sql.tokens_with_role(field, values)), key=repr)


def _make(active: list[bool], roles: list[Role | None], names: list[str], made: list[dict[str, Any]]) -> list[ApiToken]:
    """Write two tenants, three users, the memberships `roles` gives per (tenant, user), and the tokens."""
    tenants = [Tenant.objects.create(slug=f"t{i}", name=f"T{i}", is_active=active[i]) for i in range(2)]
    users = [User.objects.create(username=f"u{i}-{name}", is_active=active[2 + i]) for i, name in enumerate(names)]
    for index, role in enumerate(roles):
        if role is not None:
            Membership.all_tenants.create(tenant=tenants[index // 3], user=users[index % 3], role=role)
    return ApiToken.all_tenants.bulk_create(
        ApiToken(
            tenant=None if t["tenant"] is None else tenants[t["tenant"]],
            user=users[t["user"]],
            role=Role.OPERATOR if t["tenant"] is None else t["role"],
            prefix=f"p{i}",
            digest="d" * 64,
            name=t["name"],
            expires_at=t["expires_at"],
            last_used_at=t["last_used_at"],
            revoked_at=t["revoked_at"],
        )
        for i, t in enumerate(made)
    )


@SQL_EXAMPLES
@given(
    active=st.lists(st.booleans(), min_size=5, max_size=5),
    roles=st.lists(st.none() | st.sampled_from(MEMBER_ROLES), min_size=6, max_size=6),
    names=st.lists(texts, min_size=3, max_size=3),
    made=tokens,
    asked=st.sets(st.integers(0, 7), min_size=1),
    by_id=st.booleans(),
)
def test_tokens_with_role_loads_what_the_orm_does(
    db: None,
    active: list[bool],
    roles: list[Role | None],
    names: list[str],
    made: list[dict[str, Any]],
    asked: set[int],
    by_id: bool,
) -> None:
    with rolled_back():
        created = _make(active, roles, names, made)
        # Some asked for exist, some (past the tokens made) do not.
        values: list[Any]
        if by_id:
            field, values = "id", [created[i].pk if i < len(created) else -i for i in sorted(asked)]
        else:
            field, values = "prefix", [f"p{i}" for i in sorted(asked)]
        assert _with_role(field, values, fast=True) == _with_role(field, values, fast=False)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "framework"])
def test_no_values_ask_nothing(django_assert_num_queries: Any, fast: bool) -> None:
    with django_assert_num_queries(0), override_settings(FAST_PATHS={**settings.FAST_PATHS, fastpaths.TOKEN_SQL: fast}):
        assert fast_sql.tokens_with_role("prefix", []) == []
