"""Reads of the notifications app: who listens for an event, people's choices, endpoints and the delivery log.

Functions that take a tenant id (or None, for the platform) read that
tenant's rows under its own scope, whatever scope the caller holds (the
controller calls them outside any request): `owned_by`. The platform's
rows belong to no tenant, so only they are read through `all_tenants`.
The rest run under the active scope like every other selector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from django.contrib.auth.models import User
from django.db.models import Exists, OuterRef, QuerySet

from notifications.choices import OPT_IN_KINDS, PLATFORM_KINDS, TENANT_KINDS, Channel, EventKind, email_by_default
from notifications.models import Delivery, NotificationPreference, WebhookEndpoint
from tenants.scoping import TenantOwnedModel, tenant_id_scope

Owned = TypeVar("Owned", bound=TenantOwnedModel)


@dataclass(frozen=True)
class Recipient:
    """Someone who gets an e-mail: the user and their account's address."""

    user_id: int
    address: str


@dataclass(frozen=True)
class EmailChoice:
    """One kind on someone's settings page: whether they get e-mail for it, and the default."""

    kind: str
    label: str
    email: bool
    default: bool


def kinds_for(tenant_id: int | None) -> tuple[EventKind, ...]:
    """Return the kinds a tenant's people and webhooks may hear about (the platform's for None)."""
    return TENANT_KINDS if tenant_id is not None else PLATFORM_KINDS


def owned_by(model: type[Owned], tenant_id: int | None) -> QuerySet[Owned]:
    """Return `model`'s rows of tenant `tenant_id`, read through its scoped manager under that tenant's scope,
    or the platform's rows (which belong to no tenant) for None. Lazy: the tenant is fixed when it is built."""
    if tenant_id is None:
        return model.all_tenants.filter(tenant__isnull=True)
    with tenant_id_scope(tenant_id):
        return model.objects.all()


def email_recipients(kind: EventKind, tenant_id: int | None, users: QuerySet[User]) -> list[Recipient]:
    """Return those of `users` who get e-mail for `kind` in `tenant_id` (the platform for None); one query.

    Active accounts with an address whose choice says yes: an explicit yes
    for opt-in kinds, anything but an explicit no for the others.
    """
    choices = owned_by(NotificationPreference, tenant_id).filter(user_id=OuterRef("pk"), kind=kind)
    listening = users.filter(is_active=True).exclude(email="")
    if kind in OPT_IN_KINDS:
        listening = listening.filter(Exists(choices.filter(email=True)))
    else:
        listening = listening.exclude(Exists(choices.filter(email=False)))
    return [Recipient(user_id=pk, address=email) for pk, email in listening.values_list("pk", "email")]


def operators() -> QuerySet[User]:
    """Return the platform's operators (active staff): who hears about the platform's kinds."""
    return User.objects.filter(is_staff=True, is_active=True)


def subscribed_endpoints(kind: EventKind, tenant_id: int | None) -> list[WebhookEndpoint]:
    """Return the active endpoints of `tenant_id` (the platform's for None) subscribed to `kind`; one query.

    A tenant has a handful of endpoints at most, so their subscriptions are
    compared here rather than in SQL (SQLite cannot look inside a JSON list).
    """
    active = owned_by(WebhookEndpoint, tenant_id).filter(is_active=True).only("pk", "url", "kinds")
    return [endpoint for endpoint in active if kind in endpoint.kinds]


def email_choices(user: User, tenant_id: int | None) -> list[EmailChoice]:
    """Return `user`'s e-mail choice for every kind of `tenant_id` (the platform's for None), defaults filled in."""
    kinds = kinds_for(tenant_id)
    chosen = dict(owned_by(NotificationPreference, tenant_id).filter(user=user).values_list("kind", "email"))
    return [
        EmailChoice(
            kind=kind.value,
            label=kind.label,
            email=chosen.get(kind.value, email_by_default(kind)),
            default=email_by_default(kind),
        )
        for kind in kinds
    ]


def endpoints_in_scope() -> QuerySet[WebhookEndpoint]:
    """Return the active tenant's webhook endpoints (scoped)."""
    return WebhookEndpoint.objects.all()


def platform_endpoints() -> QuerySet[WebhookEndpoint]:
    """Return the platform's webhook endpoints (no tenant): operators' only."""
    return owned_by(WebhookEndpoint, None)


def _log(deliveries: QuerySet[Delivery]) -> QuerySet[Delivery]:
    return deliveries.select_related("notification").order_by("-created_at", "-id")


def webhook_deliveries_in_scope() -> QuerySet[Delivery]:
    """Return the active tenant's webhook deliveries, newest first (scoped)."""
    return _log(Delivery.objects.filter(channel=Channel.WEBHOOK))


def platform_webhook_deliveries() -> QuerySet[Delivery]:
    """Return the platform's webhook deliveries, newest first: operators' only."""
    return _log(owned_by(Delivery, None).filter(channel=Channel.WEBHOOK))


def emails_to(user: User, tenant_id: int | None) -> QuerySet[Delivery]:
    """Return the e-mails sent (or on their way) to `user` about `tenant_id` (the platform for None), newest first."""
    return _log(owned_by(Delivery, tenant_id).filter(channel=Channel.EMAIL, user=user))
