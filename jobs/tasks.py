"""Controller tasks of the jobs app (queue `control`): thin, named, idempotent."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from jobs.scheduler.shell import run_pass


@shared_task(name="jobs.schedule_pass", ignore_result=True)
def schedule_pass() -> dict[str, Any] | None:
    """Run one scheduling pass; a pass already running elsewhere makes this one return None at once."""
    result = run_pass()
    if result is None:
        return None
    return {"placed": result.placed, "preempted": result.preempted, "waiting": result.waiting}
