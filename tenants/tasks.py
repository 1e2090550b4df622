"""Celery tasks of the tenancy app: thin, named, idempotent."""

from __future__ import annotations

from celery import shared_task

from common.task_names import PURGE_EXPIRED_SESSIONS
from tenants import services


@shared_task(name=PURGE_EXPIRED_SESSIONS)
def purge_expired_sessions() -> int:
    """Delete expired browser sessions; return how many went."""
    return services.purge_expired_sessions()
