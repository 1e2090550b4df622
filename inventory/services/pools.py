"""Writes of node pools: create, update, delete (operators only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.db.models import ProtectedError

from common.errors import Conflict, FieldErrors, add_errors, gather, invalid, raise_errors
from inventory.choices import PlacementPolicy
from inventory.models import DEFAULT_USAGE_HALF_LIFE_SECONDS, NodePool
from tenants.context import Actor
from tenants.models import Tenant, TenantQuota
from tenants.services import delete_audited, record_audit_event, snapshot, update_audited
from tenants.services.access import require_operator
from tenants.services.validation import clean_fields

POOL_FIELDS = ["name", "description", "dedicated_tenant", "placement_policy", "usage_half_life_seconds"]


def _check_dedication(pool: NodePool, tenant: Tenant | None) -> None:
    if tenant is None or pool.pk is None:
        return
    others = TenantQuota.all_tenants.filter(pool=pool).exclude(tenant=tenant)
    if others.exists():
        raise invalid(
            "dedicated_tenant",
            "pool_has_other_tenants",
            "Other tenants hold quota in this pool; remove their quotas before dedicating it.",
        )


def pool_errors(values: Mapping[str, Any]) -> FieldErrors:
    """Return every rule the new pool's `values` break, by field (only the fields given are judged)."""
    errors: FieldErrors = {}
    columns = {name: value for name, value in values.items() if name in POOL_FIELDS}
    unjudged = [field.name for field in NodePool._meta.fields if field.name not in columns]
    gather(errors, lambda: clean_fields(NodePool(**columns), exclude=unjudged))
    if "name" in columns and "name" not in errors and NodePool.objects.filter(name=columns["name"]).exists():
        add_errors(errors, invalid("name", "unique", f"A pool named {columns['name']!r} already exists."))
    return errors


@transaction.atomic
def create_node_pool(
    *,
    actor: Actor,
    name: str,
    description: str = "",
    dedicated_tenant: Tenant | None = None,
    placement_policy: str = PlacementPolicy.BINPACK,
    usage_half_life_seconds: int = DEFAULT_USAGE_HALF_LIFE_SECONDS,
) -> NodePool:
    """Create a node pool; operators only.

    Raises one ValidationError naming every failing field: a taken or malformed name, an unknown policy,
    a usage half-life above MAX_USAGE_HALF_LIFE_SECONDS.
    """
    require_operator(actor)
    values = {
        "name": name,
        "description": description,
        "dedicated_tenant": dedicated_tenant,
        "placement_policy": placement_policy,
        "usage_half_life_seconds": usage_half_life_seconds,
    }
    raise_errors(pool_errors(values))
    pool = NodePool(**values)
    pool.save()
    tenant_id = dedicated_tenant.pk if dedicated_tenant else None
    record_audit_event(
        actor=actor, action="node_pool.create", obj=pool, tenant_id=tenant_id, after=snapshot(pool, POOL_FIELDS)
    )
    return pool


_UNSET = object()


@transaction.atomic
def update_node_pool(
    *,
    actor: Actor,
    pool: NodePool,
    description: str | None = None,
    dedicated_tenant: Tenant | None | object = _UNSET,
    placement_policy: str | None = None,
    usage_half_life_seconds: int | None = None,
) -> NodePool:
    """Change a pool's description, dedicated tenant (None makes it shared), placement policy or usage half-life
    (seconds; 0: fair share forgets past use at once); operators only.

    Raises one ValidationError naming every failing field, among them dedicating a pool in which
    other tenants hold quota.
    """
    require_operator(actor)
    pool = NodePool.objects.select_for_update().get(pk=pool.pk)
    changes: dict[str, object] = {}
    if description is not None:
        changes["description"] = description
    if placement_policy is not None:
        changes["placement_policy"] = placement_policy
    if usage_half_life_seconds is not None:
        changes["usage_half_life_seconds"] = usage_half_life_seconds
    tenant_id = pool.dedicated_tenant_id
    errors: FieldErrors = {}
    if dedicated_tenant is not _UNSET:
        assert dedicated_tenant is None or isinstance(dedicated_tenant, Tenant)
        gather(errors, lambda: _check_dedication(pool, dedicated_tenant))
        changes["dedicated_tenant"] = dedicated_tenant
        tenant_id = dedicated_tenant.pk if dedicated_tenant is not None else None
    return update_audited(
        actor=actor,
        action="node_pool.update",
        obj=pool,
        changes=changes,
        tenant_id=tenant_id,
        audited=POOL_FIELDS,
        errors=errors,
    )


@transaction.atomic
def delete_node_pool(*, actor: Actor, pool: NodePool) -> None:
    """Delete a pool; operators only. Raises Conflict while quotas still reference it."""
    require_operator(actor)
    try:
        delete_audited(
            actor=actor, action="node_pool.delete", obj=pool, tenant_id=pool.dedicated_tenant_id, audited=POOL_FIELDS
        )
    except ProtectedError as error:
        raise Conflict("Remove the quotas in this pool first.", code="pool_in_use") from error
