"""The notebook proxy's access read: where a user reaches a notebook, asked on every proxied request.

Looks across tenants (the proxy's URL names no tenant) and decides access
itself; whoever may not reach a notebook gets the same None as for one that
does not exist. `jobs.proxy` is its caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db import connection

from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Replica, Workload
from tenants.choices import Role
from tenants.models import Membership, Tenant


@dataclass(frozen=True)
class ProxyTarget:
    """Where the notebook proxy sends a user's request: the base URL of the notebook's Jupyter server and its token."""

    workload_id: int
    endpoint: str
    secret: str = field(repr=False)
    user_id: int  # who reaches it: the proxy's WebSocket leg re-checks when this user's access changes


def _proxy_target_sql() -> str:
    """Return the proxy's access query: the notebook's endpoint and secret when the user may reach it.

    Written out rather than built by the ORM: the proxy asks on every
    request (every file of JupyterLab, every chunk of a download), and
    compiling the equivalent queryset (subqueries, Exists) cost about as
    much CPU as a 10 MB transfer through the proxy. Only the models' own
    table names, quoted by the backend, are interpolated.
    """
    quote = connection.ops.quote_name
    workload, replica, membership, tenant = (quote(m._meta.db_table) for m in (Workload, Replica, Membership, Tenant))
    return f"""
        SELECT w.session_secret,
               (SELECT r.endpoint FROM {replica} r
                 WHERE r.workload_id = w.id AND r.attempt = w.attempt AND r.{quote("index")} = 0 AND r.endpoint <> ''
                 LIMIT 1)
          FROM {workload} w
          JOIN {tenant} t ON t.id = w.tenant_id
         WHERE w.id = %(workload)s AND w.kind = %(notebook)s AND w.state IN (%(starting)s, %(running)s)
           AND w.session_secret <> '' AND t.is_active = %(active)s
           AND ((w.owner_id = %(user)s AND EXISTS (
                    SELECT 1 FROM {membership} m
                     WHERE m.tenant_id = w.tenant_id AND m.user_id = %(user)s AND m.role IN (%(member)s, %(admin)s)))
                OR EXISTS (
                    SELECT 1 FROM {membership} m
                     WHERE m.tenant_id = w.tenant_id AND m.user_id = %(user)s AND m.role = %(admin)s))
    """  # noqa: S608 -- only the models' own quoted table names are interpolated


def notebook_proxy_target(user: AbstractBaseUser | AnonymousUser, workload_id: int) -> ProxyTarget | None:
    """Return where `user` reaches notebook `workload_id` through the proxy, or None when they may not.

    Looks across tenants (the proxy's URL names no tenant). Only the
    notebook's owner (while still a member or admin of its tenant) and the
    admins of its tenant get a target, and only while the tenant is active;
    anyone else (anonymous, deactivated, another tenant, other members,
    operators who are not the tenant's admins) gets None, exactly as for a
    notebook that does not exist, is not starting or running, has no
    session secret, or whose current attempt's first replica has reported
    no endpoint yet. One query.
    """
    if not user.is_authenticated or not user.is_active:
        return None
    params = {
        "workload": workload_id,
        "active": True,
        "user": user.pk,
        "notebook": str(WorkloadKind.NOTEBOOK),
        "starting": str(WorkloadState.STARTING),
        "running": str(WorkloadState.RUNNING),
        "member": str(Role.MEMBER),
        "admin": str(Role.ADMIN),
    }
    with connection.cursor() as cursor:
        cursor.execute(_proxy_target_sql(), params)
        row = cursor.fetchone()
    if row is None or not row[1]:
        return None
    return ProxyTarget(workload_id=workload_id, endpoint=row[1], secret=row[0], user_id=user.pk)
