"""List filters of the notifications API."""

from __future__ import annotations

import django_filters
from django import forms
from drf_spectacular.utils import extend_schema_field

from common.api.fields import ID_MAX
from common.api.filters import StrictFilterSet
from notifications.models import Delivery


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": ID_MAX})
class IdFilter(django_filters.NumberFilter):
    """An object id: a whole number from 1 (a NumberFilter alone would take 0.5)."""

    field_class = forms.IntegerField


class DeliveryFilter(StrictFilterSet):
    """Filter deliveries by state and by the endpoint they went to (its id)."""

    endpoint = IdFilter(field_name="endpoint_id", min_value=1, max_value=ID_MAX)

    class Meta:
        model = Delivery
        fields = ["state"]
