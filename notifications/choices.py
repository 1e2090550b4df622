"""Event kinds, delivery channels and delivery states (with their transition table)."""

from __future__ import annotations

from django.db import models

from common.transitions import Transitions


class EventKind(models.TextChoices):
    """What a notification is about. Dotted, like every event name in the console."""

    BUDGET_THRESHOLD = "budget.threshold", "Budget threshold reached"
    BUDGET_EXHAUSTED = "budget.exhausted", "Budget used up"
    REQUEST_DECIDED = "request.decided", "Increase request decided"
    IDLE_WARNING = "notebook.idle_warning", "Idle notebook warning"
    WORKLOAD_FINISHED = "workload.finished", "Workload finished"
    WORKLOAD_FAILED = "workload.failed", "Workload failed"
    WORKLOAD_STOPPED = "workload.stopped", "Workload stopped by the platform"
    NODE_HEALTH = "node.health", "Node or GPU health (operators)"


K = EventKind

# Kinds a tenant's people and webhooks hear about; the platform's (operators and platform webhooks) are apart.
TENANT_KINDS: tuple[EventKind, ...] = (
    K.BUDGET_THRESHOLD,
    K.BUDGET_EXHAUSTED,
    K.REQUEST_DECIDED,
    K.IDLE_WARNING,
    K.WORKLOAD_FINISHED,
    K.WORKLOAD_FAILED,
    K.WORKLOAD_STOPPED,
)
PLATFORM_KINDS: tuple[EventKind, ...] = (K.NODE_HEALTH,)
# E-mail for these only when the user asked for it: a busy batch user would drown otherwise.
OPT_IN_KINDS: frozenset[EventKind] = frozenset({K.WORKLOAD_FINISHED, K.WORKLOAD_FAILED})


def email_by_default(kind: EventKind | str) -> bool:
    """Return whether a user who never chose gets e-mail for `kind`."""
    return EventKind(kind) not in OPT_IN_KINDS


class Channel(models.TextChoices):
    """How a delivery travels."""

    EMAIL = "email", "E-mail"
    WEBHOOK = "webhook", "Webhook"


class DeliveryState(models.TextChoices):
    """Where one delivery stands. `sending` is a worker's claim; `pending` with a later `next_attempt_at` waits
    for a retry."""

    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    SUCCEEDED = "succeeded", "Delivered"
    FAILED = "failed", "Failed"


D = DeliveryState

DELIVERY_TRANSITIONS: Transitions[DeliveryState] = Transitions(
    "delivery",
    DeliveryState,
    {
        D.PENDING: frozenset({D.SENDING, D.FAILED}),
        # A failed attempt with retries left goes back to pending; a claim whose worker died too.
        D.SENDING: frozenset({D.SUCCEEDED, D.PENDING, D.FAILED}),
        D.SUCCEEDED: frozenset(),
        D.FAILED: frozenset(),
    },
)
