"""Periodic housekeeping of the tenancy app."""

from __future__ import annotations

from celery import shared_task
from django.contrib.sessions.models import Session
from django.utils import timezone


@shared_task(name="tenants.purge_expired_sessions")
def purge_expired_sessions() -> int:
    """Delete browser sessions past their expiry; return how many went. Idempotent."""
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    return deleted
