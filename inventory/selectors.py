"""Reads of the inventory app."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from inventory.models import NodePool
from tenants.context import Actor
from tenants.models import Membership


def pools_visible_to(actor: Actor) -> QuerySet[NodePool]:
    """Return the pools `actor` may see: all for operators, else shared pools and its tenants' dedicated ones.

    A token narrows this to the pools its own tenant may use.
    """
    pools = NodePool.objects.select_related("dedicated_tenant")
    if actor.is_operator:
        return pools
    if actor.user is None:
        return pools.none()
    if actor.token is not None:
        tenant_ids: list[int | None] = [actor.token.tenant_id]
    else:
        tenant_ids = list(Membership.all_tenants.filter(user=actor.user).values_list("tenant_id", flat=True))
    return pools.filter(Q(dedicated_tenant__isnull=True) | Q(dedicated_tenant_id__in=tenant_ids))


def pools_open_to_tenant(tenant_id: int) -> QuerySet[NodePool]:
    """Return the pools a tenant may hold quota in: shared ones and those dedicated to it."""
    return NodePool.objects.filter(Q(dedicated_tenant__isnull=True) | Q(dedicated_tenant_id=tenant_id))
