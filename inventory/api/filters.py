"""List filters of the inventory API."""

from __future__ import annotations

import django_filters

from common.api.filters import StrictFilterSet
from inventory.choices import VolumeKind
from inventory.models import Volume


class VolumeFilter(StrictFilterSet):
    """Filter volumes by kind and by the slug of the project they belong to."""

    kind = django_filters.ChoiceFilter(choices=VolumeKind.choices)
    project = django_filters.CharFilter(field_name="project__slug")

    class Meta:
        model = Volume
        fields = ["kind", "project"]
