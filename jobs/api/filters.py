"""List filters of the jobs API."""

from __future__ import annotations

import django_filters

from common.api.filters import StrictFilterSet
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Workload


class WorkloadFilter(StrictFilterSet):
    """Filter workloads by state, kind, project slug and owner username."""

    state = django_filters.ChoiceFilter(choices=WorkloadState.choices)
    kind = django_filters.ChoiceFilter(choices=WorkloadKind.choices)
    project = django_filters.CharFilter(field_name="project__slug")
    owner = django_filters.CharFilter(field_name="owner__username")
    pool = django_filters.CharFilter(field_name="pool__name")

    class Meta:
        model = Workload
        fields = ["state", "kind", "project", "owner", "pool"]
