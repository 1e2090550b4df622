"""Ask the controller for a scheduling pass once the current transaction commits.

Submissions, cancellations and completions call `request_scheduling_pass`;
the pass itself is the coalescing task `jobs.schedule_pass`, requested by
name so this module does not import the scheduler shell. A request made
while a pass already waits in the broker merges into it (`common.control`),
because a pass looks at everything pending: however many submissions
arrive, and however far the workers fall behind, at most one pass waits.
"""

from __future__ import annotations

import logging

from django.db import transaction
from kombu.exceptions import OperationalError

from common import control
from common.task_names import SCHEDULE_PASS

log = logging.getLogger(__name__)


def request_scheduling_pass() -> None:
    """Ask for one scheduling pass after the current transaction commits (at once outside one)."""
    transaction.on_commit(enqueue_scheduling_pass)


def enqueue_scheduling_pass() -> bool:
    """Send `jobs.schedule_pass` unless one is already waiting; return whether a message was sent."""
    try:
        return control.request(SCHEDULE_PASS)
    except (OperationalError, OSError):
        # The work is committed; a lost trigger only delays placement until the periodic pass.
        log.warning("could not enqueue %s; the periodic pass will place the work", SCHEDULE_PASS, exc_info=True)
        return False
