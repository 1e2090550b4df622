"""State changes of workloads: compare-and-swap, one event per transition.

`transition_workload` is the one way any code (services, the scheduler's
tasks, reconcile) moves a single workload between states: it changes the
row only if it is still in one of the expected states, so two workers racing
on the same workload cannot both win, and it writes the event in the same
transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs import live
from jobs.choices import WORKLOAD_TRANSITIONS, WorkloadKind, WorkloadState
from jobs.models import Allocation, Workload, WorkloadEvent
from jobs.services import predictions
from notifications.services import notify_workload_ended

# What an ending job's run time and its prediction's error are computed from (`predictions.finished_fields`).
_RUN_FIELDS: tuple[str, ...] = ("started_at", "scheduled_at", "attained_seconds", "predicted_runtime_seconds")
_RUN_FIELDS += ("project_id", "gpus_per_replica", "replicas")


def next_attempt_fields() -> dict[str, Any]:
    """Return the fields of a workload going back to the queue as a new attempt (`transition_workload` kwargs).

    The attempt counts up; what the last attempt left is cleared: its place
    and hint in the queue, its times and exit code, the notebook's session
    secret, its stop request and idle marks. A restart and a requeue (after
    a preemption, a lost node or a lost run) both start from here.
    """
    return {
        "attempt": F("attempt") + 1,
        "reason_hint": "",
        "queue_position": None,
        "scheduled_at": None,
        "started_at": None,
        "finished_at": None,
        "exit_code": None,
        "session_secret": "",
        "stop_requested_at": None,
        "idle_warned_at": None,
        "idle_extended_at": None,
    }


@transaction.atomic
def transition_workload(
    *,
    workload_id: int,
    from_states: Iterable[WorkloadState | str],
    to_state: WorkloadState | str,
    reason_code: str = "",
    message: str = "",
    **fields: Any,
) -> bool:
    """Move the workload to `to_state` if it is in one of `from_states`; return whether it moved.

    Also sets the reason and any extra model `fields`, and writes one
    `workload.state_changed` event. Returns False, changing nothing, when
    the row is in another state (someone else moved it first) or gone.
    Raises ForbiddenTransition (a ValueError) when a listed source state
    cannot reach `to_state`: that is a bug in the caller, not a race.
    """
    target, sources = WORKLOAD_TRANSITIONS.check_all(from_states, to_state)
    row = (
        Workload.all_tenants.select_for_update()
        .filter(pk=workload_id, state__in=sources)
        .values("tenant_id", "state", "owner_id", "name", "kind", *_RUN_FIELDS)
        .first()
    )
    if row is None:
        return False
    now = timezone.now()
    changes = {"reason_code": reason_code, "reason_message": message, "updated_at": now, **fields}
    if target in (WorkloadState.SUCCEEDED, WorkloadState.FAILED):
        changes = {**predictions.finished_fields(row, target, now), **changes}
    moved = WORKLOAD_TRANSITIONS.move(
        Workload.all_tenants.filter(pk=workload_id), from_states=[row["state"]], to_state=target, **changes
    )
    if moved != 1:
        return False
    WorkloadEvent.all_tenants.create(
        tenant_id=row["tenant_id"],
        workload_id=workload_id,
        kind="workload.state_changed",
        from_state=row["state"],
        to_state=target,
        reason_code=reason_code,
        message=message,
        created_at=now,
    )
    if target in (WorkloadState.SUCCEEDED, WorkloadState.FAILED):
        notify_workload_ended(
            tenant_id=row["tenant_id"], owner_id=row["owner_id"], workload_id=workload_id, name=row["name"],
            workload_kind=row["kind"], failed=target == WorkloadState.FAILED, reason_code=reason_code, message=message,
        )  # fmt: skip
    if target == WorkloadState.SUCCEEDED and row["kind"] == WorkloadKind.JOB:
        # A run of their shape finished: jobs waiting without a prediction may have one now.
        predictions.predict_waiting_like(
            project_id=row["project_id"], gpus_per_replica=row["gpus_per_replica"], replicas=row["replicas"]
        )
    live.publish_workload_changes([workload_id], state_changed=[workload_id])
    return True


@transaction.atomic
def transition_workloads(
    *,
    workload_ids: Iterable[int],
    from_states: Iterable[WorkloadState | str],
    to_state: WorkloadState | str,
    messages: Mapping[int, str],
    **fields: Any,
) -> list[int]:
    """Batch form of `transition_workload` for one target state: return the ids that moved, in id order.

    The same rule for many rows at once: one locking read (rows in none of
    `from_states` are left alone), one update, one insert of their events
    (`messages[id]` each), one live notice. For targets that notify
    nobody (not `succeeded` or `failed`); raises ValueError for those and
    for a source state that cannot reach `to_state`.
    """
    target, sources = WORKLOAD_TRANSITIONS.check_all(from_states, to_state)
    if target in (WorkloadState.SUCCEEDED, WorkloadState.FAILED):
        raise ValueError("an ending workload notifies its owner: use transition_workload")
    rows = list(
        Workload.all_tenants.select_for_update()
        .filter(pk__in=sorted(set(workload_ids)), state__in=sources)
        .order_by("pk")
        .values("pk", "tenant_id", "state")
    )
    if not rows:
        return []
    now = timezone.now()
    moved = [row["pk"] for row in rows]
    # The rows are locked in a source state, so the update moves exactly these.
    WORKLOAD_TRANSITIONS.move(
        Workload.all_tenants.filter(pk__in=moved),
        from_states=sources,
        to_state=target,
        reason_code="",
        reason_message="",
        updated_at=now,
        **fields,
    )
    WorkloadEvent.all_tenants.bulk_create(
        WorkloadEvent(
            tenant_id=row["tenant_id"],
            workload_id=row["pk"],
            kind="workload.state_changed",
            from_state=row["state"],
            to_state=target,
            message=messages.get(row["pk"], ""),
            created_at=now,
        )
        for row in rows
    )
    live.publish_workload_changes(moved, state_changed=moved)
    return moved


def release_allocations(*, workload_id: int) -> int:
    """Mark the workload's active allocations released now; return how many were. Idempotent."""
    released = Allocation.all_tenants.filter(workload_id=workload_id, released_at__isnull=True).update(
        released_at=timezone.now()
    )
    if released:
        live.publish_allocations_changed(workload_id)
        live.publish_workload_changes([workload_id])  # its page shows the GPUs it holds
    return released
