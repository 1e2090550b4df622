"""Node pools now; nodes and GPUs arrive with the inventory issue."""

from __future__ import annotations

from django.db import models

from tenants.models import SLUG_RULE


class NodePool(models.Model):
    """A group of nodes that quotas are expressed against.

    A pool with a dedicated tenant is usable by that tenant alone; other
    tenants never see it.
    """

    name = models.CharField(max_length=40, unique=True, validators=[SLUG_RULE])
    description = models.TextField(blank=True, max_length=2000)
    dedicated_tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, null=True, blank=True, related_name="dedicated_pools"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
