"""Prices with history."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from accounting.choices import Resource


class Price(models.Model):
    """The price of one hour of `resource`, in effect from `effective_from` until the next price of the same key.

    The key is (resource, pool, gpu_model): an empty pool means every pool, an
    empty `gpu_model` every model (and CPU and memory prices have none). The
    most specific price in effect wins. Prices are never edited: a change is
    a new row from a later date, and a row may only be removed before its date,
    so a report of the past always prices the past the same way.
    """

    resource = models.CharField(max_length=8, choices=Resource.choices)
    pool = models.ForeignKey(
        "inventory.NodePool", on_delete=models.PROTECT, null=True, blank=True, related_name="prices"
    )
    gpu_model = models.CharField(max_length=100, blank=True)
    amount_per_hour = models.DecimalField(max_digits=12, decimal_places=4, validators=[MinValueValidator(0)])
    effective_from = models.DateTimeField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["resource", "pool_id", "gpu_model", "effective_from"]
        constraints = [
            # One price per key and date, pool-wide prices included (NULL pools are distinct to a plain unique).
            models.UniqueConstraint(
                fields=["resource", "pool", "gpu_model", "effective_from"],
                condition=Q(pool__isnull=False),
                name="price_once_per_pool_key",
            ),
            models.UniqueConstraint(
                fields=["resource", "gpu_model", "effective_from"],
                condition=Q(pool__isnull=True),
                name="price_once_per_platform_key",
            ),
            models.CheckConstraint(condition=Q(amount_per_hour__gte=0), name="price_not_negative"),
            # A model names a GPU: CPU and memory prices are per pool at most.
            models.CheckConstraint(
                condition=Q(resource=Resource.GPU) | Q(gpu_model=""), name="price_model_only_for_gpus"
            ),
        ]

    def __str__(self) -> str:
        where = self.pool.name if self.pool is not None else "every pool"
        return f"{self.resource} {self.gpu_model or '*'} in {where} from {self.effective_from:%Y-%m-%d}"
