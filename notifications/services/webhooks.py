"""Webhook endpoints: tenant admins manage their tenant's, operators the platform's. Each write is audited.

The secret is made here, returned once (`IssuedWebhook`) and never shown
again; rotating it makes a new one, and the old one stops signing at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from common.errors import Conflict, FieldErrors, add_errors, invalid, raise_errors
from notifications import guard, selectors, signing
from notifications.models import WebhookEndpoint
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Tenant
from tenants.services import delete_audited, record_audit_event, snapshot, update_audited
from tenants.services.access import require_operator, require_role

AUDITED = ["url", "description", "kinds", "is_active"]
MAX_ENDPOINTS = 20
MAX_DESCRIPTION = 200


@dataclass(frozen=True)
class IssuedWebhook:
    """An endpoint and its signing secret, as shown the one time it is made."""

    endpoint: WebhookEndpoint
    secret: str


def _require_manager(actor: Actor, tenant_id: int | None, tenant: Tenant | None = None) -> None:
    """Return when `actor` manages the endpoints of `tenant` (admins) or of the platform (operators)."""
    if tenant_id is None:
        require_operator(actor)
        return
    require_role(actor, tenant if tenant is not None else Tenant.objects.get(pk=tenant_id), Role.ADMIN)


def _kind_errors(kinds: Any, tenant_id: int | None) -> list[ValidationError]:
    allowed = [kind.value for kind in selectors.kinds_for(tenant_id)]
    if not isinstance(kinds, list | tuple) or not all(isinstance(kind, str) for kind in kinds):
        return [ValidationError("Give a list of event kinds.", code="invalid")]
    if not kinds:
        return [ValidationError(f"Subscribe to at least one of: {', '.join(allowed)}.", code="required")]
    unknown = sorted({kind for kind in kinds if kind not in allowed})
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        message = f"Unknown event kind{plural} {', '.join(unknown)}; choose from {', '.join(allowed)}."
        return [ValidationError(message, code="unknown_kind")]
    return []


def webhook_errors(values: Mapping[str, Any], *, tenant_id: int | None) -> FieldErrors:
    """Return what is wrong with the endpoint fields in `values` (those present), every field at once.

    `url`: http or https, and a host webhooks may reach (`notifications.guard`);
    `kinds`: a non-empty list of the tenant's (or the platform's) event kinds;
    `description`: at most 200 characters.
    """
    errors: FieldErrors = {}
    if "url" in values:
        problem = guard.url_problem(str(values["url"]), allow_private=settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE)
        if problem is not None:
            errors["url"] = [ValidationError(problem, code="webhook_url")]
    if "kinds" in values:
        found = _kind_errors(values["kinds"], tenant_id)
        if found:
            errors["kinds"] = found
    if len(str(values.get("description", ""))) > MAX_DESCRIPTION:
        errors["description"] = [ValidationError(f"Keep it under {MAX_DESCRIPTION} characters.", code="max_length")]
    return errors


def _snapshot(endpoint: WebhookEndpoint) -> dict[str, Any]:
    return snapshot(endpoint, AUDITED)


@transaction.atomic
def create_webhook(
    *,
    actor: Actor,
    tenant: Tenant | None,
    url: str,
    kinds: Sequence[str],
    description: str = "",
    is_active: bool = True,
) -> IssuedWebhook:
    """Create an endpoint of `tenant` (of the platform for None) and return it with its secret.

    Tenant admins make their tenant's, operators the platform's. Raises
    ValidationError naming every failing field at once (`webhook_errors`),
    Conflict (`too_many_webhooks`) past MAX_ENDPOINTS, PermissionDenied or
    Http404 for an actor who may not; nothing is written then.
    """
    tenant_id = tenant.pk if tenant is not None else None
    _require_manager(actor, tenant_id, tenant)
    raise_errors(webhook_errors({"url": url, "kinds": list(kinds), "description": description}, tenant_id=tenant_id))
    existing = selectors.owned_by(WebhookEndpoint, tenant_id)
    if existing.count() >= MAX_ENDPOINTS:
        raise Conflict(f"A tenant has at most {MAX_ENDPOINTS} webhook endpoints.", code="too_many_webhooks")
    secret = signing.new_secret()
    endpoint = existing.create(
        tenant=tenant, url=url.strip(), kinds=sorted(set(kinds)), description=description.strip(),
        is_active=is_active, secret=secret, created_by=actor.user,
    )  # fmt: skip
    record_audit_event(
        actor=actor, action="webhook.create", obj=endpoint, tenant_id=tenant_id, after=_snapshot(endpoint)
    )
    return IssuedWebhook(endpoint=endpoint, secret=secret)


def _locked(endpoint: WebhookEndpoint) -> WebhookEndpoint:
    return selectors.owned_by(WebhookEndpoint, endpoint.tenant_id).select_for_update().get(pk=endpoint.pk)


@transaction.atomic
def update_webhook(*, actor: Actor, endpoint: WebhookEndpoint, changes: Mapping[str, Any]) -> WebhookEndpoint:
    """Change an endpoint's `url`, `kinds`, `description` or `is_active`; return it.

    Raises ValidationError naming every failing field at once (and for a
    field that cannot be changed), PermissionDenied or Http404 as
    `create_webhook` does.
    """
    _require_manager(actor, endpoint.tenant_id)
    errors = webhook_errors(changes, tenant_id=endpoint.tenant_id)
    for name in sorted(set(changes) - set(AUDITED)):
        add_errors(errors, invalid(name, "read_only", "This field cannot be changed."))
    raise_errors(errors)
    clean = dict(changes)
    if "url" in clean:
        clean["url"] = str(clean["url"]).strip()
    if "kinds" in clean:
        clean["kinds"] = sorted(set(clean["kinds"]))
    return update_audited(
        actor=actor, action="webhook.update", obj=_locked(endpoint), changes=clean, tenant_id=endpoint.tenant_id,
        audited=_snapshot,
    )  # fmt: skip


@transaction.atomic
def rotate_webhook_secret(*, actor: Actor, endpoint: WebhookEndpoint) -> IssuedWebhook:
    """Give the endpoint a new secret and return it (shown once); the old one signs nothing from now on."""
    _require_manager(actor, endpoint.tenant_id)
    secret = signing.new_secret()
    locked = update_audited(
        actor=actor, action="webhook.rotate_secret", obj=_locked(endpoint),
        changes={"secret": secret, "secret_rotated_at": timezone.now()}, tenant_id=endpoint.tenant_id,
        audited=lambda e: {"secret_rotated_at": e.secret_rotated_at.isoformat() if e.secret_rotated_at else None},
    )  # fmt: skip
    return IssuedWebhook(endpoint=locked, secret=secret)


@transaction.atomic
def delete_webhook(*, actor: Actor, endpoint: WebhookEndpoint) -> None:
    """Delete an endpoint. Its delivery log stays; deliveries still waiting for it fail when their turn comes."""
    _require_manager(actor, endpoint.tenant_id)
    delete_audited(
        actor=actor, action="webhook.delete", obj=_locked(endpoint), tenant_id=endpoint.tenant_id, audited=_snapshot
    )


def require_webhooks_manageable(actor: Actor, tenant: Tenant | None) -> None:
    """Return when `actor` manages the webhooks of `tenant` (of the platform for None); raise PermissionDenied or
    Http404 otherwise. For pages and endpoints that show secrets' hints and delivery logs."""
    if actor.user is None:
        raise PermissionDenied("Webhooks are managed by people.")
    _require_manager(actor, tenant.pk if tenant is not None else None, tenant)
