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


@register.filter
def duration(seconds: float | None) -> str:
    """Return a length of time for people, rounded to its largest unit: '45 s', '12 min', '2 h', '3 days'; '' when
    unknown."""
    if seconds is None:
        return ""
    seconds = max(0.0, float(seconds))
    for unit, size, next_size in (("s", 1, 60), ("min", 60, 3600), ("h", 3600, 86400)):
        if seconds < next_size - size / 2:
            return f"{round(seconds / size)} {unit}"
    days = round(seconds / 86400)
    return f"{days} day{'s' if days != 1 else ''}"


@register.filter
def from_now(moment: datetime | None) -> str:
    """Return how far ahead `moment` is: 'in about 2 h', or 'now' within a minute or past; '' when unknown."""
    if moment is None:
        return ""
    left = (moment - timezone.now()).total_seconds()
    return "now" if left < 60 else f"in about {duration(left)}"


@register.filter
def starts_in(moment: datetime | None) -> str:
    """Return when an estimated start is from now: 'starts in about 2 h', 'should start within a minute'; '' for
    no estimate."""
    if moment is None:
        return ""
    left = (moment - timezone.now()).total_seconds()
    if left < 60:
        return "should start within a minute"
    return f"starts in about {duration(left)}"


@register.filter
def gpu_hours(gpu_seconds: float | None) -> str:
    """Return GPU-seconds as GPU-hours for people: '1.5 GPU-h', '0.02 GPU-h'; '—' when unknown."""
    if gpu_seconds is None:
        return "—"
    hours = gpu_seconds / 3600
    return f"{hours:.1f} GPU-h" if hours >= 1 else f"{hours:.2f} GPU-h"
