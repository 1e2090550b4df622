"""Prices with their history, as reports read them: the rate in effect at a moment, and what usage costs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db.models import Q, QuerySet

from accounting.choices import Resource
from accounting.models import Price
from accounting.selectors.figures import Usage
from inventory.selectors import pools_visible_to
from tenants.context import Actor

_MICRO = Decimal("0.000001")


@dataclass(frozen=True)
class PriceBook:
    """Every price with its history, loaded once per report (a small table: a few rows per pool and model)."""

    prices: tuple[Price, ...]
    currency: str

    @classmethod
    def load(cls) -> PriceBook:
        return cls(tuple(Price.objects.order_by("effective_from", "id")), settings.ACCOUNTING_CURRENCY)

    def changes_within(self, start: datetime, end: datetime) -> list[datetime]:
        """Return the sorted moments strictly inside (start, end) at which some price takes effect."""
        return sorted({p.effective_from for p in self.prices if start < p.effective_from < end})

    def rate(self, resource: str, *, pool_id: int | None, gpu_model: str, at: datetime) -> Decimal:
        """Return the price per hour of `resource` in effect at `at`: the most specific key wins, else 0."""
        best: tuple[int, datetime] | None = None
        amount = Decimal(0)
        for price in self.prices:
            if price.resource != resource or price.effective_from > at:
                continue
            if price.pool_id not in (None, pool_id) or price.gpu_model not in ("", gpu_model):
                continue
            # Model beats pool: an H100 costs what an H100 costs, wherever it sits, unless the pool says otherwise.
            rank = (2 if price.gpu_model else 0) + (1 if price.pool_id else 0)
            if best is None or (rank, price.effective_from) >= best:
                best, amount = (rank, price.effective_from), price.amount_per_hour
        return amount

    def cost(self, usage: Usage, *, pool_id: int, gpu_model: str, at: datetime) -> Decimal:
        """Return what `usage` costs at the prices in effect at `at`, to the micro-unit (rounded on display)."""
        hours = {
            Resource.GPU: usage.gpu_seconds,
            Resource.CPU: usage.cpu_seconds,
            Resource.MEMORY: usage.memory_gib_seconds,
        }
        total = Decimal(0)
        for resource, seconds in hours.items():
            if seconds:
                rate = self.rate(
                    resource, pool_id=pool_id, gpu_model=gpu_model if resource == Resource.GPU else "", at=at
                )
                total += rate * Decimal(repr(seconds)) / Decimal(3600)
        return total.quantize(_MICRO)


def prices() -> QuerySet[Price]:
    """Return every price, newest date first within each key: prices are platform-wide, not tenant data."""
    return Price.objects.select_related("pool").order_by("resource", "pool__name", "gpu_model", "-effective_from")


def prices_visible_to(actor: Actor) -> QuerySet[Price]:
    """Return the prices `actor` may read, ordered as `prices`: platform-wide ones and those of the pools it
    may see (`inventory.selectors.pools_visible_to`); a pool dedicated to another tenant, and its prices, stay
    hidden (they say what that tenant pays). Operators see every price."""
    if actor.is_operator:
        return prices()
    return prices().filter(Q(pool__isnull=True) | Q(pool__in=pools_visible_to(actor)))
