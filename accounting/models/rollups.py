"""Usage rolled up by UTC hour, and how far the rollups reach.

Written by accounting.services.rollups, read by the reports.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from tenants.scoping import TenantOwnedModel


class UsageHour(TenantOwnedModel):
    """What one owner's work in one project, pool and GPU model held in one UTC hour: the ledger's figures, summed.

    A row holds exactly what a report of that hour computes from the
    allocations and the GPU minutes (see accounting.selectors): seconds of
    each resource, and the utilization figures of the held minutes.
    `gpu_model` is empty for CPU-only work. Rows are replaced an hour range
    at a time, never edited.
    """

    # References without database constraints: the ids are copied from allocations whose own foreign keys hold
    # them, and Django still applies on_delete (a tenant's rows go with it; a project, user or pool with usage
    # is kept, as its workloads keep it anyway). Four checks per row written were a third of a backfill's time.
    # No index of their own either: (tenant, hour)'s serves the tenant, and only deleting a project, user or
    # pool without any usage (a rare operator's action) scans for the others.
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False
    )
    hour = models.DateTimeField(help_text="Start of the UTC hour.")
    project = models.ForeignKey(
        "tenants.Project", on_delete=models.PROTECT, related_name="+", db_index=False, db_constraint=False
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", db_index=False, db_constraint=False
    )
    pool = models.ForeignKey(
        "inventory.NodePool", on_delete=models.PROTECT, related_name="+", db_index=False, db_constraint=False
    )
    gpu_model = models.CharField(max_length=100, blank=True)
    gpu_seconds = models.FloatField(default=0.0)
    cpu_seconds = models.FloatField(default=0.0)
    memory_gib_seconds = models.FloatField(default=0.0)
    sampled_gpu_seconds = models.FloatField(default=0.0)
    utilization_minutes = models.FloatField(default=0.0)
    idle_gpu_seconds = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            # One row per hour and group; its index, hour first, serves "every tenant, these hours" and the
            # rollups' replacement of an hour range.
            models.UniqueConstraint(
                fields=["hour", "tenant", "project", "owner", "pool", "gpu_model"], name="usage_hour_once"
            ),
            models.CheckConstraint(
                condition=Q(gpu_seconds__gte=0, cpu_seconds__gte=0, memory_gib_seconds__gte=0)
                & Q(sampled_gpu_seconds__gte=0, utilization_minutes__gte=0, idle_gpu_seconds__gte=0),
                name="usage_hour_not_negative",
            ),
        ]
        # One tenant's hours (a month grouped by project, user, pool or model).
        indexes = [models.Index(fields=["tenant", "hour"], name="usage_hour_tenant_hour")]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.project_id}/{self.owner_id}@{self.hour:%Y-%m-%dT%HZ}"


class RollupMark(models.Model):
    """How far UsageHour may be trusted: one row (id 1), none before the first rollup.

    Every UTC hour in [rolled_from, settled_until) is in UsageHour and was
    last rolled up at least the lateness window after it closed, so late GPU
    samples and late releases are in it (accounting.services.rollups says why that
    window). Hours from `settled_until` on may be rolled up already, but a
    later run rolls them again: reports read them from the ledger.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    rolled_from = models.DateTimeField(null=True, blank=True)
    settled_until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(id=1), name="rollup_mark_single"),
            models.CheckConstraint(
                condition=Q(rolled_from__isnull=True, settled_until__isnull=True)
                | Q(rolled_from__isnull=False, settled_until__gte=models.F("rolled_from")),
                name="rollup_mark_ordered",
            ),
        ]

    def __str__(self) -> str:
        return f"usage hours settled from {self.rolled_from} until {self.settled_until}"
