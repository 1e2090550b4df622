"""Reads the pages need beyond the apps' own selectors."""

from __future__ import annotations

from django.db.models import QuerySet

from tenants.context import Actor
from tenants.models import ApiToken, Tenant
from tenants.selectors import memberships_of_user, tenant_summaries


def tenants_for_switcher(actor: Actor) -> list[Tenant]:
    """Return the tenants the navigation offers: every tenant for operators, else the viewer's own."""
    if actor.user is None:
        return []
    if actor.is_operator:
        return list(Tenant.objects.order_by("slug")[:200])
    return [m.tenant for m in memberships_of_user(actor.user)]


def tokens_in_scope_of_user(actor: Actor) -> QuerySet[ApiToken]:
    """Return the viewer's own tokens in the tenant in scope."""
    return ApiToken.objects.filter(user=actor.user).select_related("user")


def tenants_with_counts() -> QuerySet[Tenant]:
    """Return every tenant with its project and member counts, for the operators' list."""
    return tenant_summaries().order_by("slug")
