"""Who may open a notebook: the one rule, asked by the proxy on every request, by the hand-off, the pages and the API.

`may_open_notebook` states it over what the caller already holds (the
notebook's row, the user and their role in its tenant); the pages and the
API ask it whether to offer the link, and `notebook_proxy_target` reads the
row and the user's membership in one query and asks it before every
proxied request and hand-off. Whoever may not open a notebook gets the same
None from the proxy as for one that does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.db.models import OuterRef, QuerySet, Subquery

from common.sql import fetch
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Replica, Workload
from tenants.choices import Role
from tenants.models import Membership

# A notebook can be opened while its Jupyter server is coming up or serving.
OPEN_STATES = frozenset({WorkloadState.STARTING, WorkloadState.RUNNING})
# The roles with which a notebook's owner still opens it: a viewer (or a former member) no longer does.
_OWNER_ROLES = frozenset({Role.MEMBER, Role.ADMIN})


class NotebookRow(Protocol):
    """What the rule reads of a notebook: a `Workload` has it all."""

    @property
    def owner_id(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def session_secret(self) -> str: ...


def is_notebook_opener(workload: NotebookRow, *, user_id: int | None, role: str | None) -> bool:
    """Return whether user `user_id`, holding `role` in `workload`'s tenant, is one who may open it.

    That is its owner while a member or admin of its tenant, and the
    tenant's admins. `role` is the user's membership role in the notebook's
    tenant, None when they have none or the tenant is deactivated; a page or
    an API view may pass the role the user acts with in the request instead
    (a token caps it; an operator's is `operator`), which never grants more.
    """
    if user_id is None or role is None:
        return False
    return role == Role.ADMIN or (workload.owner_id == user_id and role in _OWNER_ROLES)


def may_open_notebook(workload: NotebookRow, *, user_id: int | None, role: str | None) -> bool:
    """Return whether user `user_id` (holding `role`, as `is_notebook_opener` takes it) may open `workload` now.

    It must be a notebook, starting or running, with a session secret, and
    the user one of its openers.
    """
    serving = workload.kind == WorkloadKind.NOTEBOOK and workload.state in OPEN_STATES and bool(workload.session_secret)
    return serving and is_notebook_opener(workload, user_id=user_id, role=role)


@dataclass(frozen=True)
class ProxyTarget:
    """Where the notebook proxy sends a user's request: the base URL of the notebook's Jupyter server and its token."""

    workload_id: int
    endpoint: str
    secret: str = field(repr=False)
    user_id: int  # who reaches it: the proxy's WebSocket leg re-checks when this user's access changes


@dataclass(frozen=True)
class _Row:
    owner_id: int
    kind: str
    state: str
    session_secret: str
    role: str | None
    endpoint: str | None


def notebook_proxy_target(user: AbstractBaseUser | AnonymousUser, workload_id: int) -> ProxyTarget | None:
    """Return where `user` reaches notebook `workload_id` through the proxy, or None when they may not.

    Looks across tenants (the proxy's URL names no tenant): `may_open_notebook`
    with the user's membership role in the notebook's tenant, while the user
    and the tenant are active. None, exactly as for a notebook that does not
    exist, also while the current attempt's first replica has reported no
    endpoint. One query, read afresh every time: access lost takes effect at
    the next request.
    """
    if not user.is_authenticated or not user.is_active:
        return None
    row = _read(workload_id, user.pk)
    if row is None or not row.endpoint or not may_open_notebook(row, user_id=user.pk, role=row.role):
        return None
    return ProxyTarget(workload_id=workload_id, endpoint=row.endpoint, secret=row.session_secret, user_id=user.pk)


def notebook_access_rows(workload_id: int, user_id: int) -> QuerySet[Workload, tuple[Any, ...]]:
    """Return the query `notebook_proxy_target` runs: notebook `workload_id` of an active tenant as (owner id,
    kind, state, session secret, `user_id`'s membership role there or None, the endpoint of the current
    attempt's first replica or None). Looks across tenants."""
    role = Membership.all_tenants.filter(tenant_id=OuterRef("tenant_id"), user_id=user_id).order_by().values("role")[:1]
    replicas = Replica.all_tenants.filter(workload_id=OuterRef("pk"), attempt=OuterRef("attempt"), index=0)
    endpoint = replicas.exclude(endpoint="").order_by().values("endpoint")[:1]
    return (
        Workload.all_tenants.filter(pk=workload_id, tenant__is_active=True)
        .order_by()
        .values_list("owner_id", "kind", "state", "session_secret", Subquery(role), Subquery(endpoint))
    )


# Stand-ins for the two values of `notebook_access_rows`, found again among the compiled statement's parameters.
_WORKLOAD, _USER = -918_273_645_001, -918_273_645_002


@cache
def _statement(vendor: str) -> tuple[str, tuple[Any, ...]]:
    # The proxy asks on every request it serves; building and compiling the queryset costs ten times the
    # query (3.5 ms against 0.3 ms on SQLite). So the ORM compiles it once per database backend, and each
    # read runs that statement with its own two values in place of the stand-ins: the ORM's query, not a copy.
    sql, params = notebook_access_rows(_WORKLOAD, _USER).query.sql_with_params()
    if _WORKLOAD not in params or _USER not in params:  # a Django that inlined a value would answer wrongly
        raise RuntimeError(f"the notebook access query on {vendor} no longer takes its values as parameters")
    return sql, tuple(params)


def _read(workload_id: int, user_id: int) -> _Row | None:
    sql, template = _statement(connection.vendor)
    values = {_WORKLOAD: workload_id, _USER: user_id}
    rows = fetch(sql, [values.get(value, value) if isinstance(value, int) else value for value in template])
    return _Row(*rows[0]) if rows else None
