"""Ask the controller for a scheduling pass once the current transaction commits.

Submissions and cancellations call `request_scheduling_pass`; the pass itself
is the Celery task `jobs.schedule_pass`, enqueued by name so this module does
not import the scheduler shell. Requests are debounced: at most one task per
half-second window across every web process sharing the cache, because a pass
already looks at everything pending and the periodic pass catches the rest.
"""

from __future__ import annotations

import logging
import time

from django.core.cache import cache
from django.db import transaction
from kombu.exceptions import OperationalError

from gpucloud.celery import app

log = logging.getLogger(__name__)

SCHEDULE_PASS_TASK = "jobs.schedule_pass"  # noqa: S105 -- a task name, not a secret
DEBOUNCE_SECONDS = 0.5
_DEBOUNCE_KEY = "jobs:schedule-pass-requested:{window}"


def request_scheduling_pass() -> None:
    """Enqueue one scheduling pass after the current transaction commits (at once outside one)."""
    transaction.on_commit(enqueue_scheduling_pass)


def enqueue_scheduling_pass() -> bool:
    """Send `jobs.schedule_pass` unless one was sent in this debounce window; return whether it was sent.

    The window is part of the key rather than the key's timeout because the
    Redis cache backend rounds timeouts down to whole seconds (0.5 s would
    expire at once and debounce nothing).
    """
    window = int(time.time() / DEBOUNCE_SECONDS)
    if not cache.add(_DEBOUNCE_KEY.format(window=window), 1, timeout=2):
        return False
    try:
        app.send_task(SCHEDULE_PASS_TASK, queue="control")
    except (OperationalError, OSError):
        # The work is committed; a lost trigger only delays placement until the periodic pass.
        log.warning("could not enqueue %s; the periodic pass will place the work", SCHEDULE_PASS_TASK, exc_info=True)
        return False
    return True
