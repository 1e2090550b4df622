"""List filters of the tenancy API."""

from __future__ import annotations

import django_filters

from common.api.filters import StrictFilterSet
from tenants.models import AuditEvent


class AuditEventFilter(StrictFilterSet):
    """Filter audit events by action, object, subject (part of its name), actor, request and time range."""

    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    actor = django_filters.CharFilter(field_name="actor_label")
    action_prefix = django_filters.CharFilter(field_name="action", lookup_expr="startswith")
    subject = django_filters.CharFilter(field_name="object_repr", lookup_expr="icontains")

    class Meta:
        model = AuditEvent
        fields = ["action", "object_type", "object_id", "via", "request_id"]


class PlatformAuditEventFilter(AuditEventFilter):
    """The platform-wide audit filter adds the tenant."""

    class Meta(AuditEventFilter.Meta):
        fields = [*AuditEventFilter.Meta.fields, "tenant"]
