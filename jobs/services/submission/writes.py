"""The writes of a submission (step 7): workloads, their events and the audit entries, in three statements."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from common import fast_bulk
from common.protocol.messages import RESOURCE_FIELDS
from jobs import fast_sql, live
from jobs.choices import WorkloadEventKind, WorkloadKind, WorkloadState
from jobs.models import Workload
from jobs.services import predictions
from jobs.services.spec import WorkloadSpec
from jobs.services.submission.pending import Pending, Submission
from jobs.services.submission.replays import item_keys
from jobs.triggers import request_scheduling_pass
from tenants.models import AuditEvent, Project
from tenants.services.audit import audit_event, record_audit_events

# Where Jupyter listens inside a notebook's sandbox; the launch code and the proxy rely on it.
NOTEBOOK_PORT = 8888


def insert(pending: list[Pending]) -> None:
    """Write the accepted requests' workloads, events and audit entries in three statements; set their outcomes."""
    if not pending:
        return
    now = timezone.now()
    predicted = predictions.submission_fields(
        filter(None, (_work_key(item, spec) for item in pending for spec in item.specs))
    )
    rows: list[Workload] = []
    for item in pending:
        key = item.request.idempotency_key
        keys: list[str | None] = list(item_keys(key, len(item.specs))) if key is not None else [None] * len(item.specs)
        rows.extend(
            _workload(item.project, item.user, spec, item_key, item.digest, now, _predicted(predicted, item, spec))
            for spec, item_key in zip(item.specs, keys, strict=True)
        )
    workloads = fast_bulk.insert(rows)
    _insert_submitted_events([w.pk for w in workloads], now)
    start = 0
    audit: list[AuditEvent] = []
    for item in pending:
        mine = workloads[start : start + len(item.specs)]
        start += len(mine)
        item.outcome = Submission(workloads=mine, created=True)
        audit.append(
            audit_event(
                actor=item.request.actor,
                action="workload.submit",
                obj=mine[0],
                tenant_id=item.project.tenant_id,
                after={"project": item.project.slug, "count": len(mine), "ids": [w.pk for w in mine][:100]},
                info=item.request.info,
            )
        )
    record_audit_events(audit)
    request_scheduling_pass()
    live.publish_new_workloads(workloads)


def _work_key(item: Pending, spec: WorkloadSpec) -> predictions.WorkKey | None:
    """Return what a job's run-time prediction looks up; None for a notebook (never predicted: `predictions`)."""
    if spec.kind != WorkloadKind.JOB:
        return None
    return predictions.WorkKey(item.project.pk, item.user.pk, spec.image, spec.gpus_per_replica, spec.replicas)


def _predicted(
    predicted: Mapping[predictions.WorkKey, Mapping[str, Any]], item: Pending, spec: WorkloadSpec
) -> Mapping[str, Any] | None:
    key = _work_key(item, spec)
    return predicted.get(key) if key is not None else None


def _insert_submitted_events(workload_ids: list[int], now: datetime) -> None:
    """Write each workload's `workload.submitted` event in one INSERT ... SELECT from the rows just written.

    Built in the database rather than as model instances: for a bulk
    submission, preparing a thousand event objects cost as much as the
    workloads themselves. The submitter named is the owner, whom every
    submission creates its workloads for.
    """
    fast_sql.insert_submitted_events(
        workload_ids, kind=WorkloadEventKind.SUBMITTED.value, to_state=WorkloadState.PENDING.value, created_at=now
    )


def _workload(
    project: Project,
    owner: User,
    spec: WorkloadSpec,
    key: str | None,
    digest: str,
    now: datetime,
    predicted: Mapping[str, Any] | None,
) -> Workload:
    workload = fast_bulk.new(
        Workload,
        {
            "tenant_id": project.tenant_id,
            "project_id": project.pk,
            "owner_id": owner.pk,
            "kind": spec.kind,
            "name": spec.name,
            "image": spec.image,
            "command": list(spec.command),
            "env": dict(spec.env),
            "gpus_per_replica": spec.gpus_per_replica,
            "replicas": spec.replicas,
            "gpu_models": sorted(set(spec.gpu_models)),
            "pool_id": spec.pool.pk,
            **{name: getattr(spec, name) for name in RESOURCE_FIELDS},
            "priority_class": spec.priority_class,
            "max_runtime_seconds": spec.max_runtime_seconds,
            "requeue_limit": spec.requeue_limit,
            "stop_signal": spec.stop_signal,
            "preset_id": spec.preset.pk if spec.preset is not None else None,
            "idle_timeout_seconds": spec.idle_timeout_seconds,
            "service_port": NOTEBOOK_PORT if spec.kind == WorkloadKind.NOTEBOOK else None,
            "submitted_at": now,
            "created_at": now,
            "updated_at": now,
            "idempotency_key": key,
            "request_fingerprint": digest,
            **(predicted or {}),
        },
    )
    # The related rows every answer renders, already in hand.
    _PROJECT.set_cached_value(workload, project)
    _OWNER.set_cached_value(workload, owner)
    _POOL.set_cached_value(workload, spec.pool)
    if spec.preset is not None:
        _PRESET.set_cached_value(workload, spec.preset)
    return workload


_PROJECT, _OWNER, _POOL, _PRESET = (
    Workload.project.field,
    Workload.owner.field,
    Workload.pool.field,
    Workload.preset.field,
)
