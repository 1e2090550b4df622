"""What was sent: one Notification per event, one Delivery per e-mail recipient and per webhook endpoint."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from notifications.choices import Channel, DeliveryState, EventKind
from notifications.models.listeners import WebhookEndpoint
from tenants.models import Tenant
from tenants.scoping import TenantOwnedModel


class Notification(TenantOwnedModel):
    """One event somebody listened for: its kind, words for people and data for machines.

    `event_id` is the id receivers see (`X-Gpucloud-Event-Id`, the body's
    `id`): the same on every retry and on every endpoint, so a receiver can
    drop duplicates.
    """

    # Nullable here: node health belongs to no tenant.
    tenant = models.ForeignKey(  # type: ignore[assignment]
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    event_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    subject = models.CharField(max_length=200)
    body = models.TextField(max_length=10000)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.CheckConstraint(condition=Q(kind__in=EventKind.values), name="notification_kind_valid")]

    def __str__(self) -> str:
        return f"{self.kind} {self.event_id}"


class Delivery(TenantOwnedModel):
    """One notification on its way to one e-mail address or one webhook endpoint, and how that went.

    Workers claim a delivery by moving it from `pending` to `sending` with a
    compare-and-swap, so two never send it at once; a failed attempt with
    retries left returns it to `pending` with `next_attempt_at` pushed back
    (exponential back-off with jitter). `attempt_log` keeps every attempt:
    when, how long, the HTTP status or the error, and when the next was due.
    `address` is where it went when it was made (the e-mail address, the
    endpoint's URL), so the log stays true after the user or the endpoint
    changes or goes.
    """

    tenant = models.ForeignKey(  # type: ignore[assignment]
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=8, choices=Channel.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.SET_NULL, null=True, blank=True, related_name="deliveries"
    )
    address = models.CharField(max_length=2000)
    state = models.CharField(max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    attempt_log = models.JSONField(default=list)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(
                fields=["next_attempt_at"], condition=Q(state__in=["pending", "sending"]), name="delivery_due"
            ),
            models.Index(fields=["tenant", "channel", "-created_at"], name="delivery_tenant_channel"),
            models.Index(fields=["user", "-created_at"], name="delivery_user"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(channel__in=Channel.values), name="delivery_channel_valid"),
            models.CheckConstraint(condition=Q(state__in=DeliveryState.values), name="delivery_state_valid"),
            models.CheckConstraint(condition=~Q(address=""), name="delivery_address_given"),
            # A waiting delivery knows when it is due, a claimed one since when, a sent one when it went,
            # and a failed one why.
            models.CheckConstraint(
                condition=~Q(state="pending") | Q(next_attempt_at__isnull=False), name="delivery_pending_is_due"
            ),
            models.CheckConstraint(
                condition=~Q(state="sending") | Q(claimed_at__isnull=False), name="delivery_sending_is_claimed"
            ),
            models.CheckConstraint(
                condition=~Q(state="succeeded") | Q(sent_at__isnull=False), name="delivery_success_has_time"
            ),
            models.CheckConstraint(condition=~Q(state="failed") | ~Q(last_error=""), name="delivery_failure_has_error"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} to {self.address[:60]} ({self.state})"
