"""The notebook proxy's access read: where a user reaches a notebook, asked on every proxied request.

Looks across tenants (the proxy's URL names no tenant) and decides access
itself; whoever may not reach a notebook gets the same None as for one that
does not exist. `jobs.proxy` is its caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser

from jobs import sql
from jobs.choices import WorkloadKind, WorkloadState
from tenants.choices import Role


@dataclass(frozen=True)
class ProxyTarget:
    """Where the notebook proxy sends a user's request: the base URL of the notebook's Jupyter server and its token."""

    workload_id: int
    endpoint: str
    secret: str = field(repr=False)
    user_id: int  # who reaches it: the proxy's WebSocket leg re-checks when this user's access changes


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
    found = sql.notebook_session(
        workload_id,
        user.pk,
        notebook=WorkloadKind.NOTEBOOK.value,
        live=[WorkloadState.STARTING.value, WorkloadState.RUNNING.value],
        owner_roles=[Role.MEMBER.value, Role.ADMIN.value],
        admin=Role.ADMIN.value,
    )
    if found is None:
        return None
    secret, endpoint = found
    if not endpoint:
        return None
    return ProxyTarget(workload_id=workload_id, endpoint=endpoint, secret=secret, user_id=user.pk)
