"""Reading requests for more (`accounting.services.increases` asks, decides and expires them)."""

from __future__ import annotations

from django.db.models import QuerySet

from accounting.choices import RequestState
from accounting.models import IncreaseRequest


def requests_in_scope() -> QuerySet[IncreaseRequest]:
    """Return the active tenant's requests, newest first, with what they name loaded."""
    return IncreaseRequest.objects.select_related("tenant", "project", "pool", "budget", "requester", "decided_by")


def requests_awaiting_operators() -> QuerySet[IncreaseRequest]:
    """Return every tenant's pending requests for the tenant itself (which operators decide), oldest first.

    Across tenants: for operator pages only (callers check the role first).
    """
    return (
        IncreaseRequest.all_tenants.filter(project__isnull=True, state=RequestState.PENDING)
        .select_related("tenant", "pool", "budget", "requester")
        .order_by("created_at", "pk")
    )
