"""Who listens: people's e-mail choices, and the webhook endpoints of tenants and of the platform."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from notifications.choices import PLATFORM_KINDS, EventKind
from tenants.models import Tenant
from tenants.scoping import TenantOwnedModel

_PLATFORM_KIND_VALUES = [kind.value for kind in PLATFORM_KINDS]


class NotificationPreference(TenantOwnedModel):
    """One user's choice of e-mail for one event kind in one tenant (`tenant` empty: the platform's kinds).

    A row exists only where the user chose; without one the kind's default
    applies (`notifications.choices.email_by_default`).
    """

    # Nullable here: operators' choices for the platform's kinds belong to no tenant.
    tenant = models.ForeignKey(  # type: ignore[assignment]
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    email = models.BooleanField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "user", "kind"], condition=Q(tenant__isnull=False), name="notify_pref_once_in_tenant"
            ),
            models.UniqueConstraint(
                fields=["user", "kind"], condition=Q(tenant__isnull=True), name="notify_pref_once_on_platform"
            ),
            models.CheckConstraint(condition=Q(kind__in=EventKind.values), name="notify_pref_kind_valid"),
            # The platform's kinds are chosen outside any tenant, the tenants' kinds inside one.
            models.CheckConstraint(
                condition=Q(tenant__isnull=True, kind__in=_PLATFORM_KIND_VALUES)
                | (Q(tenant__isnull=False) & ~Q(kind__in=_PLATFORM_KIND_VALUES)),
                name="notify_pref_kind_matches_scope",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.tenant_id}:{self.kind}={'on' if self.email else 'off'}"


class WebhookEndpoint(TenantOwnedModel):
    """A URL that receives signed JSON POSTs for the event kinds it subscribes to.

    A tenant's (managed by its admins) or, with `tenant` empty, the
    platform's (managed by operators, for node health). `secret` signs every
    delivery (HMAC-SHA256); the console makes it, shows it once, and keeps
    it because signing needs it.
    """

    tenant = models.ForeignKey(  # type: ignore[assignment]
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="webhook_endpoints"
    )
    url = models.CharField(max_length=2000)
    description = models.CharField(max_length=200, blank=True)
    kinds = models.JSONField(default=list)
    secret = models.CharField(max_length=80)
    is_active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    secret_rotated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["tenant", "is_active"], name="webhook_tenant_active")]
        constraints = [
            models.CheckConstraint(condition=~Q(url=""), name="webhook_url_given"),
            models.CheckConstraint(condition=~Q(secret=""), name="webhook_secret_given"),
        ]

    def __str__(self) -> str:
        return self.url

    @property
    def secret_hint(self) -> str:
        """The secret's first characters, so people can tell which one a receiver holds."""
        return f"{self.secret[:10]}…"

    def audit_label(self) -> str:
        """How the audit log names the endpoint: its URL."""
        return self.url[:200]
