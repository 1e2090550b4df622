"""Log retention: deleting the chunks older than their tenant's retention period, a batch at a time."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from jobs.models import LogChunk
from tenants.models import Tenant

# Retention deletes this many chunks per statement, so no delete holds locks for long.
PURGE_BATCH = 1000


def _cutoffs(now: datetime) -> list[Q]:
    """Return one condition per retention period in use: chunks of those tenants created before its cutoff."""
    default_days = int(settings.LOG_RETENTION_DAYS)
    custom = Tenant.objects.exclude(log_retention_days__isnull=True).exclude(log_retention_days=default_days)
    days_by_tenant: dict[int, list[int]] = {}
    for tenant_id, days in custom.values_list("id", "log_retention_days"):
        days_by_tenant.setdefault(days or default_days, []).append(tenant_id)
    conditions = [
        Q(tenant_id__in=ids, created_at__lt=now - timedelta(days=days)) for days, ids in days_by_tenant.items()
    ]
    own_period = [tenant_id for ids in days_by_tenant.values() for tenant_id in ids]
    conditions.append(~Q(tenant_id__in=own_period) & Q(created_at__lt=now - timedelta(days=default_days)))
    return conditions


def purge_expired_logs(*, now: datetime, batch: int = PURGE_BATCH) -> int:
    """Delete log chunks older than their tenant's retention; return how many were deleted.

    A tenant's `log_retention_days` applies to its workloads, the platform's
    LOG_RETENTION_DAYS to the rest; age is the chunk's `created_at` (the
    controller's clock, not the node's). Deletes in batches of `batch`
    chunks, each its own short transaction, so a large backlog never holds
    locks for long. Looks across tenants: controller only (the periodic
    task `jobs.purge_expired_logs`).
    """
    deleted = 0
    for condition in _cutoffs(now):
        while True:
            ids = list(LogChunk.all_tenants.filter(condition).order_by("pk").values_list("pk", flat=True)[:batch])
            if not ids:
                break
            deleted += LogChunk.all_tenants.filter(pk__in=ids).delete()[0]
            if len(ids) < batch:
                break
    return deleted
