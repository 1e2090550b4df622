"""Accounting's periodic work: thin adapters over accounting.services (rollups, increases and notices)."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from accounting.services.increases import expire_requests
from accounting.services.notices import announce_budget_thresholds
from accounting.services.rollups import roll_up_recent
from common.control import CoalescingTask
from common.task_names import ANNOUNCE_BUDGET_THRESHOLDS, EXPIRE_INCREASE_REQUESTS, ROLL_UP_USAGE


@shared_task(name=ROLL_UP_USAGE, base=CoalescingTask, ignore_result=True)
def roll_up_usage() -> int:
    """Periodic: roll up the usage hours closed since the last run (and re-roll the unsettled ones)."""
    return roll_up_recent(now=timezone.now())


@shared_task(name=EXPIRE_INCREASE_REQUESTS, base=CoalescingTask, ignore_result=True)
def expire_increase_requests() -> int:
    """Periodic: expire the requests for more whose end date has come, taking back what they granted."""
    return expire_requests(now=timezone.now())


@shared_task(name=ANNOUNCE_BUDGET_THRESHOLDS, base=CoalescingTask, ignore_result=True)
def announce_budget_thresholds_task() -> int:
    """Periodic: announce each budget's soft threshold and cap once per period, when first reached."""
    return announce_budget_thresholds(now=timezone.now())
