"""Template filters of the console."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

from tenants.models import NO_LIMIT

register = template.Library()


@register.filter
def mib(value: float | None) -> str:
    """Return a size in MiB for people: '512 MiB', '80 GiB', '79.6 GiB'; '—' when unknown."""
    if value is None:
        return "—"
    for unit in ("MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f}".removesuffix(".0") + f" {unit}"
        value /= 1024
    return f"{value:.1f}".removesuffix(".0") + " TiB"


@register.filter
def ago(moment: datetime | None) -> str:
    """Return how long ago `moment` was: 'just now', '3 minutes ago', '2 days, 4 hours ago'."""
    if moment is None:
        return ""
    if (timezone.now() - moment).total_seconds() < 60:
        return "just now"
    return f"{timesince(moment)} ago"


@register.filter
def gpu_limit(value: int | None) -> str:
    """Return a quota's GPU limit for people: the number, or 'no limit' for one that never binds (NO_LIMIT)."""
    if value is None or value >= NO_LIMIT:
        return "no limit"
    return str(value)
