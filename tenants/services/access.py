"""Authorization checks that every write service makes before it changes anything."""

from __future__ import annotations

import logging
from contextvars import ContextVar, Token

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404
from kombu.exceptions import OperationalError

from common import control
from common.task_names import STOP_ORPHANED_WORK
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Tenant
from tenants.selectors import role_in_tenant

# The role the API resolved for (user, token, tenant) at the start of the request in progress, so a
# service it calls checks that role without reading it again. Only `TenantViewSet` sets it, after
# its own check, and resets it when the request ends; everything else reads the role every time.
_RoleKey = tuple[int | None, int | None, int]
_request_role: ContextVar[tuple[_RoleKey, Role] | None] = ContextVar("gpucloud_request_role", default=None)
RequestRoleToken = Token[tuple[_RoleKey, Role] | None]


def _key(actor: Actor, tenant: Tenant) -> _RoleKey:
    return (
        actor.user.pk if actor.user is not None else None,
        actor.token.pk if actor.token is not None else None,
        tenant.pk,
    )


def remember_request_role(actor: Actor, tenant: Tenant, role: Role) -> RequestRoleToken:
    """Record `role` as `actor`'s in `tenant` for the request in progress; return the token to forget it by."""
    return _request_role.set((_key(actor, tenant), role))


def forget_request_role(token: RequestRoleToken) -> None:
    """Drop the role recorded by `remember_request_role`."""
    _request_role.reset(token)


def _role(actor: Actor, tenant: Tenant) -> Role | None:
    remembered = _request_role.get()
    if remembered is not None and remembered[0] == _key(actor, tenant):
        return remembered[1]
    return role_in_tenant(actor, tenant)


def require_role(actor: Actor, tenant: Tenant, minimum: Role) -> Role:
    """Return `actor`'s role in `tenant`.

    Raises Http404 when it cannot see the tenant, PermissionDenied when its role is below `minimum`.
    """
    role = _role(actor, tenant)
    if role is None:
        raise Http404("No such tenant.")
    if not role.at_least(minimum):
        raise PermissionDenied(f"This needs the {minimum.label.lower()} role in tenant {tenant.slug}.")
    return role


def require_operator(actor: Actor) -> None:
    """Raise PermissionDenied unless `actor` is a platform operator."""
    if not actor.is_operator:
        raise PermissionDenied("Only operators can do this.")


log = logging.getLogger(__name__)


def request_work_sweep() -> None:
    """Ask, once the current transaction commits, for the work of people who lost access to be stopped.

    Called by every service that ends access (a removed member, a
    deactivated account or tenant). A lost request only delays the stop
    until the periodic sweep (WORK_SWEEP_SECONDS).
    """
    transaction.on_commit(_enqueue_work_sweep)


def _enqueue_work_sweep() -> None:
    try:
        # The controller's sweep (jobs.services.revocation), asked for by name: tenancy never imports the jobs app.
        control.request(STOP_ORPHANED_WORK)
    except (OperationalError, OSError):
        log.warning("could not enqueue %s; the periodic sweep will stop the work", STOP_ORPHANED_WORK, exc_info=True)
