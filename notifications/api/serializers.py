"""Shapes of the notifications API: endpoints (the secret only once), people's choices, the delivery log."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from common.api.fields import Integer
from notifications.models import Delivery, WebhookEndpoint

KINDS_HELP = (
    "Event kinds the endpoint receives, e.g. workload.failed (GET /notification-preferences/ lists a tenant's)."
)


class WebhookSerializer(serializers.ModelSerializer):
    """An endpoint; `secret_hint` is the secret's start, so people can tell which secret a receiver holds."""

    kinds = serializers.ListField(child=serializers.CharField(), read_only=True)
    secret_hint = serializers.CharField(read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = WebhookEndpoint
        fields = [
            "id", "url", "description", "kinds", "is_active", "secret_hint", "created_by", "created_at", "updated_at",
            "secret_rotated_at",
        ]  # fmt: skip
        read_only_fields = fields


class IssuedWebhookSerializer(WebhookSerializer):
    """An endpoint as answered when it is made or its secret rotated: with the secret, which is never shown again."""

    secret = serializers.CharField(read_only=True)

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class WebhookCreateSerializer(serializers.Serializer):
    url = serializers.CharField(max_length=2000, help_text="https:// (or http://) URL that receives signed POSTs.")
    kinds = serializers.ListField(child=serializers.CharField(max_length=40), help_text=KINDS_HELP)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    is_active = serializers.BooleanField(required=False, default=True)


class WebhookUpdateSerializer(serializers.Serializer):
    url = serializers.CharField(max_length=2000, required=False)
    kinds = serializers.ListField(child=serializers.CharField(max_length=40), required=False, help_text=KINDS_HELP)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    is_active = serializers.BooleanField(required=False)


class AttemptSerializer(serializers.Serializer):
    """One attempt: when, how long (ms), the HTTP status (webhooks) or the error, and when the next was due."""

    attempt = Integer(read_only=True)
    at = serializers.DateTimeField(read_only=True)
    ms = Integer(read_only=True)
    status = Integer(read_only=True, allow_null=True)
    error = serializers.CharField(read_only=True)
    retry_at = serializers.DateTimeField(read_only=True, required=False)


class DeliverySerializer(serializers.ModelSerializer):
    """One e-mail or webhook delivery of a notification, and every attempt at it."""

    event_id = serializers.UUIDField(source="notification.event_id", read_only=True)
    kind = serializers.CharField(source="notification.kind", read_only=True)
    subject = serializers.CharField(source="notification.subject", read_only=True)
    text = serializers.CharField(source="notification.body", read_only=True)
    payload = serializers.JSONField(
        source="notification.payload", read_only=True, help_text="What webhooks get as `data`."
    )
    endpoint = Integer(source="endpoint_id", read_only=True, allow_null=True)
    attempt_log = AttemptSerializer(many=True, read_only=True)

    class Meta:
        model = Delivery
        fields = [
            "id", "event_id", "kind", "channel", "address", "endpoint", "state", "attempts", "next_attempt_at",
            "last_status", "last_error", "attempt_log", "subject", "text", "payload", "created_at", "sent_at",
        ]  # fmt: skip
        read_only_fields = fields


class EmailChoiceSerializer(serializers.Serializer):
    """Whether e-mail for one event kind reaches the caller, and whether that is the default."""

    kind = serializers.CharField(read_only=True)
    title = serializers.CharField(source="label", read_only=True, help_text="The kind in words.")
    email = serializers.BooleanField(read_only=True)
    by_default = serializers.BooleanField(source="default", read_only=True, help_text="What a new member gets.")


class EmailChoiceUpdateSerializer(serializers.Serializer):
    email = serializers.BooleanField()


def choice_data(choice: Any) -> dict[str, Any]:
    """Return an `EmailChoice` in the API's shape."""
    return dict(EmailChoiceSerializer(choice).data)
