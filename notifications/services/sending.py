"""Sending deliveries: claim with a compare-and-swap, send outside any transaction, record the outcome.

`send_delivery` is the first attempt, enqueued when the notification
commits; `send_due_deliveries` (periodic) sends the retries that are due and
anything a lost message or a dead worker left behind. Both claim each
delivery (`pending` -> `sending`, checked row count) before they send, so two
workers never send the same attempt, and record the outcome only while the
claim is still theirs. A failed attempt is retried after an exponential
back-off with jitter (NOTIFICATIONS_RETRY_BASE_SECONDS doubling up to
NOTIFICATIONS_RETRY_MAX_SECONDS) until NOTIFICATIONS_MAX_ATTEMPTS; then the
delivery is `failed` with the last error.

Delivery is at least once: a worker that dies after sending and before
recording leaves a claim that is taken back after STALE_CLAIM, and the
attempt is made again. Receivers drop duplicates by the event id.
"""

from __future__ import annotations

import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from kombu.exceptions import OperationalError

from common.task_names import SEND_DELIVERY
from notifications.choices import DELIVERY_TRANSITIONS, Channel, DeliveryState
from notifications.models import Delivery
from notifications.transports import TRANSPORTS, Outbound, Outcome, webhook_body

log = logging.getLogger(__name__)

# A claim older than this belongs to a worker that died: every transport call has a timeout far below it.
STALE_CLAIM = timedelta(minutes=10)
# Deliveries a periodic run claims at once, and the threads that send them.
SWEEP_BATCH = 32
SWEEP_THREADS = 8
# A periodic run stops claiming more after this long; the next run goes on.
SWEEP_SECONDS = 60.0
_jitter = secrets.SystemRandom()


def retry_delay(attempt: int, *, base: float, cap: float, unit: float | None = None) -> timedelta:
    """Return how long to wait after failed attempt number `attempt` (1, 2, ...) before the next.

    Exponential (`base`, doubling, at most `cap` seconds) with "equal
    jitter": half the step is fixed, the other half random (`unit` in
    [0, 1] replaces the random draw, for tests), so retries of many
    deliveries that failed together spread out without ever coming early.
    """
    step = min(cap, base * 2 ** max(attempt - 1, 0))
    draw = _jitter.random() if unit is None else unit
    return timedelta(seconds=step / 2 + draw * step / 2)


def enqueue(delivery_ids: list[int]) -> None:
    """Send one `notifications.send_delivery` message per delivery; a broker that is down only delays them
    (the periodic `send_due_deliveries` finds them)."""
    for delivery_id in delivery_ids:
        try:
            current_app.send_task(SEND_DELIVERY, kwargs={"delivery_id": delivery_id}, queue="control")
        except (OperationalError, OSError):
            log.warning("could not enqueue delivery %s; the periodic run will send it", delivery_id, exc_info=True)
            return


def enqueue_on_commit(delivery_ids: list[int]) -> None:
    """Enqueue the deliveries once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: enqueue(delivery_ids))


def _claim(delivery_id: int, now: datetime) -> Delivery | None:
    """Move a due delivery from pending to sending; return it loaded for sending, or None when it was not due,
    not pending, or another worker claimed it first."""
    claimed = DELIVERY_TRANSITIONS.move(
        Delivery.all_tenants.filter(pk=delivery_id, next_attempt_at__lte=now),
        from_states=[DeliveryState.PENDING],
        to_state=DeliveryState.SENDING,
        claimed_at=now,
        attempts=F("attempts") + 1,
        updated_at=now,
    )
    if claimed != 1:
        return None
    return Delivery.all_tenants.select_related("notification__tenant", "endpoint").get(pk=delivery_id)


def _outbound(delivery: Delivery) -> Outbound | Outcome:
    """Return what to send for a claimed delivery, or the Outcome that ends it without sending."""
    notification = delivery.notification
    endpoint = delivery.endpoint
    secret = ""
    body = b""
    if delivery.channel == Channel.WEBHOOK:
        if endpoint is None:
            return Outcome(ok=False, error="The webhook endpoint was removed.", permanent=True)
        if not endpoint.is_active:
            return Outcome(ok=False, error="The webhook endpoint was turned off.", permanent=True)
        secret = endpoint.secret
        body = webhook_body(
            event_id=str(notification.event_id),
            kind=notification.kind,
            created_at=notification.created_at.isoformat().replace("+00:00", "Z"),
            tenant=notification.tenant.slug if notification.tenant is not None else None,
            subject=notification.subject,
            text=notification.body,
            data=notification.payload,
        )
    return Outbound(
        delivery_id=delivery.pk,
        channel=delivery.channel,
        address=delivery.address,
        event_id=str(notification.event_id),
        kind=notification.kind,
        subject=notification.subject,
        text=notification.body,
        body=body,
        secret=secret,
    )


def _attempt(delivery: Delivery) -> tuple[Outcome, int]:
    """Send a claimed delivery once through its transport; return the outcome and how long it took (ms)."""
    started = time.monotonic()
    prepared = _outbound(delivery)
    if isinstance(prepared, Outcome):
        return prepared, 0
    try:
        outcome = TRANSPORTS[delivery.channel].send(prepared)
    except Exception as error:  # a transport bug must not leave the claim hanging until STALE_CLAIM
        log.exception("delivery %s: the %s transport failed", delivery.pk, delivery.channel)
        outcome = Outcome(ok=False, error=f"{type(error).__name__}: {error}"[:1000])
    return outcome, int((time.monotonic() - started) * 1000)


def _record(delivery: Delivery, outcome: Outcome, took_ms: int, *, now: datetime) -> DeliveryState:
    """Record one attempt's outcome on a delivery this worker claimed; return the state it ends in."""
    attempt = delivery.attempts
    entry: dict[str, Any] = {
        "attempt": attempt,
        "at": now.isoformat(),
        "ms": took_ms,
        "status": outcome.status,
        "error": outcome.error,
    }
    changes: dict[str, Any] = {"last_status": outcome.status, "last_error": outcome.error, "updated_at": now}
    if outcome.ok:
        state = DeliveryState.SUCCEEDED
        changes.update(sent_at=now, next_attempt_at=None)
    elif outcome.permanent or attempt >= settings.NOTIFICATIONS_MAX_ATTEMPTS:
        state = DeliveryState.FAILED
        changes.update(next_attempt_at=None, last_error=outcome.error or "Failed.")
    else:
        state = DeliveryState.PENDING
        wait = retry_delay(
            attempt,
            base=settings.NOTIFICATIONS_RETRY_BASE_SECONDS,
            cap=settings.NOTIFICATIONS_RETRY_MAX_SECONDS,
        )
        changes["next_attempt_at"] = now + wait
        entry["retry_at"] = changes["next_attempt_at"].isoformat()
    changes["attempt_log"] = [*delivery.attempt_log, entry]
    kept = DELIVERY_TRANSITIONS.move(
        Delivery.all_tenants.filter(pk=delivery.pk, claimed_at=delivery.claimed_at),
        from_states=[DeliveryState.SENDING],
        to_state=state,
        **changes,
    )
    if kept != 1:
        log.warning("delivery %s: the claim was taken back while sending; its outcome is dropped", delivery.pk)
    return state


def send_delivery(*, delivery_id: int, now: datetime | None = None) -> DeliveryState | None:
    """Send delivery `delivery_id` if it is due and nobody else is sending it; return its state after the
    attempt, or None when there was nothing for this call to send (already sent, failed, claimed elsewhere,
    or waiting for a later retry). Idempotent: calling it again sends nothing twice."""
    moment = now or timezone.now()
    delivery = _claim(delivery_id, moment)
    if delivery is None:
        return None
    outcome, took = _attempt(delivery)
    return _record(delivery, outcome, took, now=timezone.now() if now is None else moment)


def recover_stale_claims(*, now: datetime) -> int:
    """Put claims older than STALE_CLAIM (their worker died) back to pending, due now; return how many."""
    return DELIVERY_TRANSITIONS.move(
        Delivery.all_tenants.filter(claimed_at__lt=now - STALE_CLAIM),
        from_states=[DeliveryState.SENDING],
        to_state=DeliveryState.PENDING,
        next_attempt_at=now,
        updated_at=now,
    )


def _due(now: datetime, limit: int) -> list[int]:
    due = Delivery.all_tenants.filter(state=DeliveryState.PENDING, next_attempt_at__lte=now)
    return list(due.order_by("next_attempt_at").values_list("pk", flat=True)[:limit])


def send_due_deliveries(*, now: datetime | None = None) -> dict[str, int]:
    """Send every delivery that is due (retries, and first attempts whose message was lost); return counts.

    Claims in batches and sends each batch on a few threads (the network
    calls only: claims and outcomes are written here). Stops claiming after
    SWEEP_SECONDS; the next run goes on. Safe to run beside other workers.
    """
    started = time.monotonic()
    moment = now or timezone.now()
    counts = {"recovered": recover_stale_claims(now=moment), "sent": 0, "retrying": 0, "failed": 0}
    with ThreadPoolExecutor(max_workers=SWEEP_THREADS) as pool:
        while time.monotonic() - started < SWEEP_SECONDS:
            claimed = [d for d in (_claim(pk, moment) for pk in _due(moment, SWEEP_BATCH)) if d is not None]
            if not claimed:
                break
            for delivery, (outcome, took) in zip(claimed, pool.map(_attempt, claimed), strict=True):
                state = _record(delivery, outcome, took, now=timezone.now() if now is None else moment)
                key = {"succeeded": "sent", "pending": "retrying"}.get(state, "failed")
                counts[key] += 1
    return counts
