"""Notebook hibernation: stop a notebook and keep everything but its GPU; resume it as it was.

A hibernated notebook holds no GPU and no container; its files (and what
its owner installed with `pip install --user`) are in its home volume, and
JupyterLab keeps its workspace there too. Resume queues it again as a new
attempt with the same settings, and its page brings the owner back to the
file they worked on last (`Workload.lab_path`, recorded from Jupyter's
sessions while it ran and when it is hibernated).
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.db import transaction
from django.utils import timezone

from common.errors import Conflict
from jobs.choices import ACTIVE_STATES, ReasonCode, WorkloadKind, WorkloadState
from jobs.jupyter import JupyterClient, JupyterUnavailable
from jobs.models import Replica, Workload
from jobs.selectors.notebook_access import is_notebook_opener
from jobs.services.actions import (
    HIBERNATABLE_STATES,
    check_rules_again,
    record_action,
    reloaded,
    require_actor,
    still_stopping,
)
from jobs.services.lifecycle import next_attempt_fields, transition_workload
from jobs.services.stopping import stop_workload
from tenants.context import Actor
from tenants.scoping import tenant_scope

# States a resumed notebook may already be in: a second Resume (a double click, a retried call) is a no-op.
RESUMED_STATES = (WorkloadState.PENDING, *ACTIVE_STATES)


def _require_owner_or_admin(actor: Actor, workload: Workload) -> None:
    require_actor(actor, workload)
    if workload.kind != WorkloadKind.NOTEBOOK:
        raise Conflict(
            f"{workload.name} is a batch job; only notebooks hibernate (cancel or restart a job).",
            code="not_a_notebook",
            details={"kind": workload.kind},
        )


def remember_lab_path(workload: Workload, *, client: JupyterClient | None = None) -> None:
    """Ask the notebook's Jupyter server which file was active last and record it (best effort, short timeout).

    Reads and writes under the workload's own tenant scope: the revocation sweep calls it with none active.
    """
    with tenant_scope(workload.tenant):
        replicas = Replica.objects.filter(workload=workload, attempt=workload.attempt, index=0)
        replica = replicas.exclude(endpoint="").first()
    if replica is None or not workload.session_secret:
        return
    try:
        activity = (client or JupyterClient(timeout=2.0)).activity(
            endpoint=replica.endpoint, workload_id=workload.pk, token=workload.session_secret
        )
    except JupyterUnavailable:
        return
    if activity.last_path:
        with tenant_scope(workload.tenant):
            Workload.objects.filter(pk=workload.pk).update(lab_path=activity.last_path[:500])


def hibernate_notebook(*, actor: Actor, workload: Workload) -> Workload:
    """Stop a notebook and keep it resumable: it becomes Hibernated once its container stopped; return it reloaded.

    Members hibernate their own notebooks, tenant admins any. Idempotent: a
    notebook already hibernated is returned as it is. Raises
    PermissionDenied, Http404, or Conflict (`not_a_notebook`,
    `illegal_transition` for an ended one).
    """
    _require_owner_or_admin(actor, workload)
    if workload.state == WorkloadState.HIBERNATED:
        return reloaded(workload)
    remember_lab_path(workload)  # before the stop: Jupyter answers only while it runs
    return _hibernate(actor, workload)


@transaction.atomic
def _hibernate(actor: Actor, workload: Workload) -> Workload:
    before = workload.state
    moved = stop_workload(
        workload_id=workload.pk,
        from_states=HIBERNATABLE_STATES,
        to_state=WorkloadState.HIBERNATED,
        reason_code=ReasonCode.HIBERNATED_BY_USER,
        message=f"Hibernated by {actor.label}: its GPU is free, its files are kept; Resume brings it back.",
    )
    current = reloaded(workload)
    if not moved and current.state != WorkloadState.HIBERNATED:
        raise Conflict(
            f"Notebook {current.name} is {current.state}; only a queued or running notebook can be hibernated.",
            code="illegal_transition",
            details={"current_state": current.state, "requested_state": WorkloadState.HIBERNATED.value},
        )
    if moved:
        record_action(actor=actor, action="workload.hibernate", workload=current, before=before)
    return current


@transaction.atomic
def resume_notebook(*, actor: Actor, workload: Workload) -> Workload:
    """Queue a hibernated notebook again with the same settings, as a new attempt; return it reloaded.

    The submission rules that may have changed apply again (allowed images,
    quota, the per-user notebook limit). Idempotent: a notebook already
    resumed (queued, starting or running) is returned as it is. Raises
    PermissionDenied, Http404, ValidationError (a rule), or Conflict
    (`not_a_notebook`, `still_stopping` while its GPUs are being released,
    `illegal_transition` for an ended notebook: restart it instead).
    """
    _require_owner_or_admin(actor, workload)
    current = reloaded(workload)
    if current.state in RESUMED_STATES:
        return current
    if still_stopping(workload):
        raise Conflict(
            f"Notebook {workload.name} is still stopping; resume it once its GPU is released.",
            code="still_stopping",
        )
    check_rules_again(current)
    moved = transition_workload(
        workload_id=workload.pk,
        from_states=[WorkloadState.HIBERNATED],
        to_state=WorkloadState.PENDING,
        reason_code=ReasonCode.RESUMED,
        message=f"Resumed by {actor.label} as attempt {current.attempt + 1}: same settings, same files.",
        submitted_at=timezone.now(),
        **next_attempt_fields(),
    )
    resumed = reloaded(workload)
    if not moved:
        if resumed.state in RESUMED_STATES:
            return resumed
        raise Conflict(
            f"Notebook {resumed.name} is {resumed.state}; only a hibernated notebook can be resumed.",
            code="illegal_transition",
            details={"current_state": resumed.state, "requested_state": WorkloadState.PENDING.value},
        )
    record_action(
        actor=actor, action="workload.resume", workload=resumed, before=WorkloadState.HIBERNATED.value, new_attempt=True
    )
    return resumed


def notebook_link(workload: Workload, *, viewer_id: int | None, role: str | None) -> str | None:
    """Return the console's hand-off path to `workload`'s JupyterLab for this viewer, or None when there is none.

    Only a running notebook has one, and only for those who may open it
    (`is_notebook_opener`, the rule the hand-off and the proxy ask, with the
    role the viewer holds or acts with in its tenant), so nobody else is
    offered it.
    """
    running = workload.kind == WorkloadKind.NOTEBOOK and workload.state == WorkloadState.RUNNING
    return lab_url(workload) if running and is_notebook_opener(workload, user_id=viewer_id, role=role) else None


def lab_url(workload: Workload) -> str:
    """Return the console's hand-off path that opens the notebook's JupyterLab on the notebook's own origin.

    It opens at the file its owner worked on last, else at its root.
    """
    base = f"/notebooks/{workload.pk}/open"
    if not workload.lab_path:
        return base
    return f"{base}?{urlencode({'next': f'lab/tree/{workload.lab_path}'})}"
