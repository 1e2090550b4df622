"""Workload submission: one path for the API, the UI and the CLI.

The order of a submission, all in one transaction:

1. who may submit: members into the projects they are assigned to, tenant
   admins (and operators) into any project of the tenant; viewers never;
2. the field rules of every item (no database), after filling in what an
   item leaves out from its launch preset;
3. the pool is open to the tenant and the image is on its allow-list
   (`jobs.services.images`);
4. lock the project's quota rows in the pools concerned, so concurrent
   submissions into the same project and pool take turns: count limits hold
   however many arrive at once;
5. an `Idempotency-Key` seen before returns the first result when the
   request is the same, and is refused when it differs;
6. the rules that read the ledger (quota, GPU models, largest placement,
   count limits, maximum runtime), each set-based over all items;
7. insert the workloads and their `workload.submitted` events in bulk, one
   audit event for the call, and ask for a scheduling pass after commit.

A single submission reads the ledger in at most six queries whatever it
asks for (role, quota rows with the tenant's limits, allowed images, GPUs
of the pool, and the counts a limit needs), and writes in three.

Any refusal raises before anything is written; a bulk submission is all or nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.utils import timezone

from gpucloud.errors import Conflict, invalid
from inventory.models import NodePool
from jobs import live
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Workload, WorkloadEvent
from jobs.services import images
from jobs.services import quota_rules as rules
from jobs.services.spec import WorkloadSpec, check_spec, fingerprint, prefixed
from jobs.triggers import request_scheduling_pass
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Membership, Project
from tenants.services.access import require_role
from tenants.services.audit import record_audit_event

MAX_BULK_ITEMS = 2000
MAX_IDEMPOTENCY_KEY_LENGTH = 200
# Where Jupyter listens inside a notebook's sandbox; the launch code and the proxy rely on it.
NOTEBOOK_PORT = 8888


@dataclass(frozen=True)
class Submission:
    """What a submission returned: its workloads, and whether they were created now or replayed for a retried key."""

    workloads: list[Workload]
    created: bool


def submit_workload(
    *, actor: Actor, project: Project, data: Mapping[str, Any], idempotency_key: str | None = None
) -> Workload:
    """Submit one workload into `project` and return it (the first one for a retried `idempotency_key`).

    Raises PermissionDenied, Http404 (no role in the tenant), ValidationError
    naming the field and rule, or Conflict (key reused with another request).
    """
    return submit(actor=actor, project=project, items=[data], idempotency_key=idempotency_key).workloads[0]


def submit_workloads(
    *, actor: Actor, project: Project, items: Sequence[Mapping[str, Any]], idempotency_key: str | None = None
) -> list[Workload]:
    """Submit many workloads into `project` at once, all or nothing; errors name `items[i].field`.

    Raises as `submit_workload` does.
    """
    return submit(actor=actor, project=project, items=items, idempotency_key=idempotency_key, bulk=True).workloads


@transaction.atomic
def submit(
    *,
    actor: Actor,
    project: Project,
    items: Sequence[Mapping[str, Any]],
    idempotency_key: str | None = None,
    bulk: bool = False,
) -> Submission:
    """Submit `items` into `project`; return the workloads and whether they are new (False: a replayed key).

    The implementation behind `submit_workload` and `submit_workloads`, for
    interfaces that answer a replay differently (the API's 200 instead of 201).
    """
    owner = _require_submitter(actor, project)
    _check_key(idempotency_key)
    specs = _specs(items, bulk=bulk)
    _check_presets(specs, project.tenant_id, bulk=bulk)
    rules.check_pool_open(specs, project.tenant_id, bulk=bulk)
    images.check_images(specs, project.tenant_id, bulk=bulk)
    limits = rules.lock_limits(project, _distinct_pools(specs))
    digest = fingerprint(project.pk, specs)
    if idempotency_key is not None:
        replay = _replay(project, owner, idempotency_key, digest, len(specs))
        if replay is not None:
            return Submission(workloads=replay, created=False)
    specs = rules.with_runtime_defaults(specs, limits, bulk=bulk)
    rules.check_gpu_limits(specs, limits, project, bulk=bulk)
    rules.check_placement(specs, bulk=bulk)
    rules.check_counts(specs, limits, project, owner)
    workloads = _insert(actor, project, owner, specs, idempotency_key, digest)
    request_scheduling_pass()
    live.publish_workload_changes(w.pk for w in workloads)
    return Submission(workloads=workloads, created=True)


def _require_submitter(actor: Actor, project: Project) -> User:
    role = require_role(actor, project.tenant, Role.MEMBER)
    assert actor.user is not None  # require_role refuses actors without a user
    if role.at_least(Role.ADMIN):
        return actor.user
    assigned = Membership.all_tenants.filter(tenant_id=project.tenant_id, user=actor.user, projects=project)
    if not assigned.exists():
        raise PermissionDenied(f"You are not a member of project {project.slug}; ask a tenant admin to add you.")
    return actor.user


def _check_key(key: str | None) -> None:
    if key is None:
        return
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH or not key.isprintable():
        raise invalid(
            "idempotency_key",
            "invalid",
            f"The Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable characters.",
        )


def _specs(items: Sequence[Mapping[str, Any]], *, bulk: bool) -> list[WorkloadSpec]:
    if not items:
        raise invalid("items", "empty", "Submit at least one workload.")
    if len(items) > MAX_BULK_ITEMS:
        raise invalid("items", "too_many", f"Submit at most {MAX_BULK_ITEMS} workloads at once.")
    specs: list[WorkloadSpec] = []
    errors: dict[str, Any] = {}
    for index, data in enumerate(items):
        try:
            spec = WorkloadSpec.from_data(data)
            check_spec(spec)
            specs.append(spec)
        except ValidationError as error:
            errors.update((prefixed(error, f"items[{index}].") if bulk else error).error_dict)
    if errors:
        raise ValidationError(errors)
    return specs


def _check_presets(specs: Sequence[WorkloadSpec], tenant_id: int, *, bulk: bool) -> None:
    # Interfaces resolve presets through the tenant's scope; this holds for any caller.
    for index, spec in enumerate(specs):
        if spec.preset is not None and spec.preset.tenant_id != tenant_id:
            error = invalid("preset", "does_not_exist", "No such launch preset in this tenant.")
            raise prefixed(error, f"items[{index}].") if bulk else error


def _distinct_pools(specs: Sequence[WorkloadSpec]) -> list[Any]:
    return list({spec.pool.pk: spec.pool for spec in specs}.values())


def _item_keys(key: str, count: int) -> list[str]:
    # The first workload carries the key itself, so a single submission and a
    # one-item bulk one with the same key and body are the same request.
    return [key, *(f"{key}#{index}" for index in range(1, count))]


def _replay(project: Project, owner: User, key: str, digest: str, count: int) -> list[Workload] | None:
    """Return the workloads a earlier call with `key` created, or None; raise Conflict if its request differed."""
    existing = Workload.all_tenants.filter(tenant_id=project.tenant_id, owner=owner, idempotency_key=key).first()
    if existing is None:
        return None
    if existing.request_fingerprint != digest:
        raise Conflict(
            "This Idempotency-Key was already used with a different request; use a new key for a new request.",
            code="idempotency_key_reused",
            details={"workload": existing.pk},
        )
    keys = _item_keys(key, count)
    replayed = Workload.all_tenants.filter(tenant_id=project.tenant_id, owner=owner, idempotency_key__in=keys)
    found = {w.idempotency_key: w for w in replayed.select_related("project", "pool", "owner")}
    return [found[k] for k in keys]


def _insert(
    actor: Actor, project: Project, owner: User, specs: list[WorkloadSpec], key: str | None, digest: str
) -> list[Workload]:
    now = timezone.now()
    keys: list[str | None] = list(_item_keys(key, len(specs))) if key is not None else [None] * len(specs)
    workloads = Workload.all_tenants.bulk_create(
        [_workload(project, owner, spec, item_key, digest, now) for spec, item_key in zip(specs, keys, strict=True)],
        batch_size=500,
    )
    _insert_submitted_events(actor, [w.pk for w in workloads], now)
    record_audit_event(
        actor=actor,
        action="workload.submit",
        obj=workloads[0],
        tenant_id=project.tenant_id,
        after={"project": project.slug, "count": len(workloads), "ids": [w.pk for w in workloads][:100]},
    )
    return workloads


def _insert_submitted_events(actor: Actor, workload_ids: list[int], now: datetime) -> None:
    """Write each workload's `workload.submitted` event in one INSERT ... SELECT from the rows just written.

    Built in the database rather than as model instances: for a bulk
    submission, preparing a thousand event objects cost as much as the
    workloads themselves.
    """
    event, workload, pool = (connection.ops.quote_name(m._meta.db_table) for m in (WorkloadEvent, Workload, NodePool))
    columns = "tenant_id, workload_id, kind, from_state, to_state, reason_code, message, created_at"
    message = "%s || CAST(w.gpus_per_replica * w.replicas AS TEXT) || %s || p.name || %s"
    source = f"{workload} w JOIN {pool} p ON p.id = w.pool_id"
    rows = f"SELECT w.tenant_id, w.id, %s, '', %s, '', {message}, %s FROM {source}"  # noqa: S608 -- names from the models' metadata; every value is a parameter
    where = f"w.id IN ({rules.placeholders(len(workload_ids))}) ORDER BY w.id"
    sql = f"INSERT INTO {event} ({columns}) {rows} WHERE {where}"
    params = [
        "workload.submitted",
        WorkloadState.PENDING.value,
        f"Submitted by {actor.label}: ",
        " GPU(s) in pool ",
        ".",
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, now, *workload_ids])


def _workload(
    project: Project, owner: User, spec: WorkloadSpec, key: str | None, digest: str, now: datetime
) -> Workload:
    return Workload(
        tenant_id=project.tenant_id,
        project=project,
        owner=owner,
        kind=spec.kind,
        name=spec.name,
        image=spec.image,
        command=list(spec.command),
        env=dict(spec.env),
        gpus_per_replica=spec.gpus_per_replica,
        replicas=spec.replicas,
        gpu_models=sorted(set(spec.gpu_models)),
        pool=spec.pool,
        cpu_milli=spec.cpu_milli,
        memory_mib=spec.memory_mib,
        priority_class=spec.priority_class,
        max_runtime_seconds=spec.max_runtime_seconds,
        requeue_limit=spec.requeue_limit,
        preset=spec.preset,
        idle_timeout_seconds=spec.idle_timeout_seconds,
        service_port=NOTEBOOK_PORT if spec.kind == WorkloadKind.NOTEBOOK else None,
        submitted_at=now,
        idempotency_key=key,
        request_fingerprint=digest,
    )
