"""Authorization checks that every write service makes before it changes anything."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404

from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Tenant
from tenants.selectors import role_in_tenant


def require_role(actor: Actor, tenant: Tenant, minimum: Role) -> Role:
    """Return `actor`'s role in `tenant`.

    Raises Http404 when it cannot see the tenant, PermissionDenied when its role is below `minimum`.
    """
    role = role_in_tenant(actor, tenant)
    if role is None:
        raise Http404("No such tenant.")
    if not role.at_least(minimum):
        raise PermissionDenied(f"This needs the {minimum.label.lower()} role in tenant {tenant.slug}.")
    return role


def require_operator(actor: Actor) -> None:
    """Raise PermissionDenied unless `actor` is a platform operator."""
    if not actor.is_operator:
        raise PermissionDenied("Only operators can do this.")
