"""Reads of the notifications app: who listens for an event, people's choices, endpoints and the delivery log.

Functions that take a tenant (or None, for the platform) read across the
tenant scope by design, through `all_tenants`, filtered to that tenant:
the controller calls them outside any request. The rest run under the
active scope like every other selector.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db.models import Exists, OuterRef, Q, QuerySet

from notifications.choices import OPT_IN_KINDS, PLATFORM_KINDS, TENANT_KINDS, Channel, EventKind, email_by_default
from notifications.models import Delivery, NotificationPreference, WebhookEndpoint


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


def _in(tenant_id: int | None) -> Q:
    return Q(tenant_id=tenant_id) if tenant_id is not None else Q(tenant__isnull=True)


def email_recipients(kind: EventKind, tenant_id: int | None, users: QuerySet[User]) -> list[Recipient]:
    """Return those of `users` who get e-mail for `kind` in `tenant_id` (the platform for None); one query.

    Active accounts with an address whose choice says yes: an explicit yes
    for opt-in kinds, anything but an explicit no for the others.
    """
    choices = NotificationPreference.all_tenants.filter(_in(tenant_id), user_id=OuterRef("pk"), kind=kind)
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
    active = WebhookEndpoint.all_tenants.filter(_in(tenant_id), is_active=True).only("pk", "url", "kinds")
    return [endpoint for endpoint in active if kind in endpoint.kinds]


def email_choices(user: User, tenant_id: int | None) -> list[EmailChoice]:
    """Return `user`'s e-mail choice for every kind of `tenant_id` (the platform's for None), defaults filled in."""
    kinds = kinds_for(tenant_id)
    chosen = dict(NotificationPreference.all_tenants.filter(_in(tenant_id), user=user).values_list("kind", "email"))
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
    return WebhookEndpoint.all_tenants.filter(tenant__isnull=True)


def _log(deliveries: QuerySet[Delivery]) -> QuerySet[Delivery]:
    return deliveries.select_related("notification").order_by("-created_at", "-id")


def webhook_deliveries_in_scope() -> QuerySet[Delivery]:
    """Return the active tenant's webhook deliveries, newest first (scoped)."""
    return _log(Delivery.objects.filter(channel=Channel.WEBHOOK))


def platform_webhook_deliveries() -> QuerySet[Delivery]:
    """Return the platform's webhook deliveries, newest first: operators' only."""
    return _log(Delivery.all_tenants.filter(tenant__isnull=True, channel=Channel.WEBHOOK))


def emails_to(user: User, tenant_id: int | None) -> QuerySet[Delivery]:
    """Return the e-mails sent (or on their way) to `user` about `tenant_id` (the platform for None), newest first."""
    return _log(Delivery.all_tenants.filter(_in(tenant_id), channel=Channel.EMAIL, user=user))
