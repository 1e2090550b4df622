"""Workload submission: one path for the API, the UI and the CLI.

The order of a submission, all in one transaction:

1. who may submit: members into the projects they are assigned to, tenant
   admins (and operators) into any project of the tenant; viewers never;
2. the field rules of every item (no database), after filling in what an
   item leaves out from its launch preset;
3. the pool is open to the tenant and the image is on its allow-list
   (`jobs.services.images`);
4. read the project's limits in the pools concerned, locking its quota rows
   when a count limit applies or the request has an Idempotency-Key, so
   concurrent submissions into the same project and pool take turns there:
   count limits hold however many arrive at once, and a retry racing its
   first attempt replays it;
5. an `Idempotency-Key` seen before returns the first result when the
   request is the same, and is refused when it differs;
6. the rules that read the ledger (quota, GPU models, largest placement,
   count limits, maximum runtime), each set-based over all items;
7. insert the workloads and their `workload.submitted` events in bulk, one
   audit event for the call, and ask for a scheduling pass after commit.

A single submission reads the ledger in at most six queries whatever it
asks for (role, quota rows with the tenant's limits, allowed images, GPUs
of the pool, and the counts a limit needs), and writes in three. So does a
batch of independent submissions (`submit_batch`), each step reading for
all of them at once; the API's ingest path commits concurrent requests
together that way.

Any refusal comes before anything is written; a bulk submission is all or nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import DatabaseError, connection, transaction
from django.http import Http404
from django.utils import timezone

from gpucloud import bulk
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
from tenants.context import Actor, RequestInfo
from tenants.models import AuditEvent, Membership, Project
from tenants.services.access import require_role
from tenants.services.audit import audit_event, record_audit_events

MAX_BULK_ITEMS = 2000
MAX_IDEMPOTENCY_KEY_LENGTH = 200
# Where Jupyter listens inside a notebook's sandbox; the launch code and the proxy rely on it.
NOTEBOOK_PORT = 8888


@dataclass(frozen=True)
class Submission:
    """What a submission returned: its workloads, and whether they were created now or replayed for a retried key."""

    workloads: list[Workload]
    created: bool


@dataclass(frozen=True)
class SubmissionRequest:
    """One submission of a batch (`submit_batch`): what `submit` takes, plus what its interface already knows.

    `role` is the actor's role in the project's tenant when the interface
    has read it for this request (None: read here); `info` is the request it
    came through, for the audit log (None: the request in progress).
    """

    actor: Actor
    project: Project
    items: Sequence[Mapping[str, Any]]
    idempotency_key: str | None = None
    bulk: bool = False
    role: Role | None = None
    info: RequestInfo | None = None


# What refuses one submission of a batch without touching the others.
REFUSALS = (ValidationError, PermissionDenied, Http404, Conflict)


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
    request = SubmissionRequest(actor=actor, project=project, items=items, idempotency_key=idempotency_key, bulk=bulk)
    outcome = submit_batch([request])[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def submit_batch(requests: Sequence[SubmissionRequest]) -> list[Submission | Exception]:
    """Submit several independent requests in one transaction; return each one's Submission or refusal.

    Each request succeeds or fails on its own, all or nothing within itself,
    exactly as if it had been submitted alone after the ones before it: a
    later request with the key of an earlier one replays it. The ledger is
    read once for the whole batch (about ten queries whatever its size) and
    written in three statements, which is what lets the API commit many
    concurrent submissions together (`jobs.ingest`). A refusal is one of
    `REFUSALS`. Should a write fail all the same (a constraint no check
    could foresee), nothing of the batch is kept and each request is
    submitted again alone, so that only the one at fault fails.
    """
    if not requests:
        return []
    try:
        with transaction.atomic():
            return _submit_together(requests)
    except DatabaseError:
        if len(requests) == 1:
            raise
    return [_submit_alone(request) for request in requests]


def _submit_alone(request: SubmissionRequest) -> Submission | Exception:
    try:
        with transaction.atomic():
            return _submit_together([request])[0]
    except DatabaseError as error:
        return error


@dataclass
class _Pending:
    """One request on its way through a batch; `outcome` is set once it is refused or replayed."""

    request: SubmissionRequest
    owner: User | None = None
    role: Role = Role.VIEWER  # the submitter's role in the tenant, once the first step has checked it
    specs: list[WorkloadSpec] = field(default_factory=list)
    limits: dict[int, rules.Limits] = field(default_factory=dict)
    digest: str = ""
    outcome: Submission | Exception | None = None

    @property
    def project(self) -> Project:
        return self.request.project

    @property
    def user(self) -> User:
        assert self.owner is not None  # set by the first step, which refuses requests without one
        return self.owner


def _check_each(pending: list[_Pending], check: Callable[[_Pending], None]) -> list[_Pending]:
    """Run `check` on each request still in the running; return those it did not refuse."""
    kept: list[_Pending] = []
    for item in pending:
        try:
            check(item)
        except REFUSALS as refusal:
            item.outcome = refusal
        else:
            kept.append(item)
    return kept


def _submit_together(requests: Sequence[SubmissionRequest]) -> list[Submission | Exception]:
    """The batch in the current transaction; a request repeating an earlier one's key waits for a second round."""
    first, again = _split_repeated_keys(requests)
    outcomes = dict(zip(first, _submit_round([requests[i] for i in first]), strict=True))
    if again:
        # The rows of the first round are visible here, so these replay (or clash with) them as a retry would.
        outcomes.update(zip(again, _submit_together([requests[i] for i in again]), strict=True))
    return [outcomes[index] for index in range(len(requests))]


def _split_repeated_keys(requests: Sequence[SubmissionRequest]) -> tuple[list[int], list[int]]:
    seen: set[tuple[int, int | None, str]] = set()
    first: list[int] = []
    again: list[int] = []
    for index, request in enumerate(requests):
        key = request.idempotency_key
        if key is None:
            first.append(index)
            continue
        identity = (request.project.tenant_id, request.actor.user.pk if request.actor.user else None, key)
        (again if identity in seen else first).append(index)
        seen.add(identity)
    return first, again


def _submit_round(requests: Sequence[SubmissionRequest]) -> list[Submission | Exception]:
    """Submit requests that share no idempotency key, in the order of the module's docstring."""
    everything = [_Pending(request) for request in requests]
    pending = _check_submitters(everything)
    pending = _check_each(pending, _check_input)
    pending = _check_images(pending)
    pending = _lock_limits(pending)
    pending = _replays(pending)
    pending = _check_each(pending, _check_limits)
    pending = _check_placement(pending)
    pending = _check_counts(pending)
    _insert(pending)
    outcomes: list[Submission | Exception] = []
    for item in everything:
        assert item.outcome is not None  # every request is refused, replayed or inserted by now
        outcomes.append(item.outcome)
    return outcomes


def _check_submitters(pending: list[_Pending]) -> list[_Pending]:
    """Who may submit: members into the projects they are assigned to, admins and operators into any.

    Keeps the requests in their order: later steps (count limits) take them in turn.
    """
    pending = _check_each(pending, _check_role)
    assigned = _assignments({_assignment(item) for item in pending if not item.role.at_least(Role.ADMIN)})

    def check(item: _Pending) -> None:
        if not item.role.at_least(Role.ADMIN) and _assignment(item) not in assigned:
            raise PermissionDenied(
                f"You are not a member of project {item.project.slug}; ask a tenant admin to add you."
            )

    return _check_each(pending, check)


def _assignment(item: _Pending) -> tuple[int, int, int]:
    return (item.project.tenant_id, item.user.pk, item.project.pk)


def _check_role(item: _Pending) -> None:
    request = item.request
    if request.role is None:
        item.role = require_role(request.actor, request.project.tenant, Role.MEMBER)
    elif not request.role.at_least(Role.MEMBER):
        raise PermissionDenied(f"This needs the member role in tenant {request.project.tenant.slug}.")
    else:
        item.role = request.role
    assert request.actor.user is not None  # a role comes only with a user
    item.owner = request.actor.user


def _assignments(wanted: set[tuple[int, int, int]]) -> set[tuple[int, int, int]]:
    """Return which (tenant, user, project) triples are memberships assigned to the project; one query."""
    if not wanted:
        return set()
    rows = Membership.all_tenants.filter(
        tenant_id__in={t for t, _, _ in wanted},
        user_id__in={u for _, u, _ in wanted},
        projects__in={p for _, _, p in wanted},
    ).values_list("tenant_id", "user_id", "projects")
    return set(rows) & wanted


def _check_input(item: _Pending) -> None:
    request = item.request
    _check_key(request.idempotency_key)
    item.specs = _specs(request.items, bulk=request.bulk)
    _check_presets(item.specs, request.project.tenant_id, bulk=request.bulk)
    rules.check_pool_open(item.specs, request.project.tenant_id, bulk=request.bulk)


def _check_images(pending: list[_Pending]) -> list[_Pending]:
    policies = images.policies_for_tenants({item.project.tenant_id for item in pending})

    def check(item: _Pending) -> None:
        tenant_id = item.project.tenant_id
        images.check_images(item.specs, tenant_id, bulk=item.request.bulk, policy=policies[tenant_id])

    return _check_each(pending, check)


def _lock_limits(pending: list[_Pending]) -> list[_Pending]:
    """Read the limits of every project and pool of the batch, locking the quota rows where order matters.

    Concurrent submissions into a project and pool take turns (the rows are
    locked, in one query and one order) when a count limit applies there,
    so it holds however many arrive at once, and when a submission into the
    project carries an Idempotency-Key, so that a retry racing its first
    attempt replays it. Otherwise nothing a submission checks can change
    under it, and submissions into the same project go side by side.
    """
    pairs = {(item.project.pk, spec.pool) for item in pending for spec in item.specs}
    found = rules.limits_of(pairs, lock=False)
    keyed = {item.project.pk for item in pending if item.request.idempotency_key is not None}
    in_turn = {(p, pool) for p, pool in pairs if p in keyed or ((p, pool.pk) in found and found[(p, pool.pk)].counted)}
    if in_turn:
        found.update(rules.limits_of(in_turn, lock=True))

    def check(item: _Pending) -> None:
        pools = _distinct_pools(item.specs)
        item.limits = {p.pk: found[(item.project.pk, p.pk)] for p in pools if (item.project.pk, p.pk) in found}
        rules.check_quotas_exist(item.project, pools, item.limits)

    return _check_each(pending, check)


def _check_limits(item: _Pending) -> None:
    bulk = item.request.bulk
    item.specs = rules.with_runtime_defaults(item.specs, item.limits, bulk=bulk)
    rules.check_gpu_limits(item.specs, item.limits, item.project, bulk=bulk)


def _check_placement(pending: list[_Pending]) -> list[_Pending]:
    nodes = rules.gpus_by_node(sorted({s.pool.pk for item in pending for s in item.specs if s.gpus_per_replica > 0}))
    return _check_each(pending, lambda item: rules.check_placement(item.specs, bulk=item.request.bulk, nodes=nodes))


def _check_counts(pending: list[_Pending]) -> list[_Pending]:
    """Hold each request to the count limits, counting the requests of the batch accepted before it."""
    counts = rules.load_counts([rules.CountNeed(item.specs, item.limits, item.project, item.user) for item in pending])

    def check(item: _Pending) -> None:
        rules.check_counts(item.specs, item.limits, item.project, item.user, counts)
        counts.add(item.specs, item.project, item.user)

    return _check_each(pending, check)


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


def _replays(pending: list[_Pending]) -> list[_Pending]:
    """Answer each request whose key was used before with the workloads it created (or refuse it when the
    request differs); return the others. Two queries for the whole batch, none when no request has a key."""
    keyed = [item for item in pending if item.request.idempotency_key is not None]
    for item in pending:
        item.digest = fingerprint(item.project.pk, item.specs)
    if not keyed:
        return pending
    firsts = _keyed_workloads(keyed, lambda item: [str(item.request.idempotency_key)])
    replayed = [item for item in keyed if _identity(item, str(item.request.idempotency_key)) in firsts]
    every = _keyed_workloads(replayed, _all_keys) if replayed else {}
    for item in replayed:
        existing = firsts[_identity(item, str(item.request.idempotency_key))]
        if existing.request_fingerprint != item.digest:
            item.outcome = Conflict(
                "This Idempotency-Key was already used with a different request; use a new key for a new request.",
                code="idempotency_key_reused",
                details={"workload": existing.pk},
            )
        else:
            item.outcome = Submission(workloads=[every[_identity(item, key)] for key in _all_keys(item)], created=False)
    return [item for item in pending if item.outcome is None]


def _all_keys(item: _Pending) -> list[str]:
    return _item_keys(str(item.request.idempotency_key), len(item.specs))


def _identity(item: _Pending, key: str) -> tuple[int, int, str]:
    return (item.project.tenant_id, item.user.pk, key)


def _keyed_workloads(
    items: list[_Pending], keys_of: Callable[[_Pending], list[str]]
) -> dict[tuple[int, int, str], Workload]:
    """Return the workloads carrying the keys `keys_of` gives for each item, by (tenant, owner, key); one query."""
    wanted = {_identity(item, key) for item in items for key in keys_of(item)}
    found = Workload.all_tenants.filter(
        tenant_id__in={t for t, _, _ in wanted},
        owner_id__in={o for _, o, _ in wanted},
        idempotency_key__in={k for _, _, k in wanted},
    ).select_related("project", "pool", "owner")
    by_identity = {(w.tenant_id, w.owner_id, str(w.idempotency_key)): w for w in found}
    return {identity: w for identity, w in by_identity.items() if identity in wanted}


def _insert(pending: list[_Pending]) -> None:
    """Write the accepted requests' workloads, events and audit entries in three statements; set their outcomes."""
    if not pending:
        return
    now = timezone.now()
    rows: list[Workload] = []
    for item in pending:
        key = item.request.idempotency_key
        keys: list[str | None] = list(_item_keys(key, len(item.specs))) if key is not None else [None] * len(item.specs)
        rows.extend(
            _workload(item.project, item.user, spec, item_key, item.digest, now)
            for spec, item_key in zip(item.specs, keys, strict=True)
        )
    workloads = bulk.insert(rows)
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


def _insert_submitted_events(workload_ids: list[int], now: datetime) -> None:
    """Write each workload's `workload.submitted` event in one INSERT ... SELECT from the rows just written.

    Built in the database rather than as model instances: for a bulk
    submission, preparing a thousand event objects cost as much as the
    workloads themselves. The submitter named is the owner, whom every
    submission creates its workloads for.
    """
    event, workload, pool, user = (
        connection.ops.quote_name(m._meta.db_table) for m in (WorkloadEvent, Workload, NodePool, User)
    )
    username = connection.ops.quote_name(User.USERNAME_FIELD)
    columns = "tenant_id, workload_id, kind, from_state, to_state, reason_code, message, created_at"
    message = f"%s || u.{username} || %s || CAST(w.gpus_per_replica * w.replicas AS TEXT) || %s || p.name || %s"
    source = f"{workload} w JOIN {pool} p ON p.id = w.pool_id JOIN {user} u ON u.id = w.owner_id"
    rows = f"SELECT w.tenant_id, w.id, %s, '', %s, '', {message}, %s FROM {source}"  # noqa: S608 -- names from the models' metadata; every value is a parameter
    where, ids = rules.is_in("w.id", workload_ids)
    sql = f"INSERT INTO {event} ({columns}) {rows} WHERE {where} ORDER BY w.id"
    params = ["workload.submitted", WorkloadState.PENDING.value, "Submitted by ", ": ", " GPU(s) in pool ", "."]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, now, *ids])


def _workload(
    project: Project, owner: User, spec: WorkloadSpec, key: str | None, digest: str, now: datetime
) -> Workload:
    workload = bulk.new(
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
            "cpu_milli": spec.cpu_milli,
            "memory_mib": spec.memory_mib,
            "priority_class": spec.priority_class,
            "max_runtime_seconds": spec.max_runtime_seconds,
            "requeue_limit": spec.requeue_limit,
            "preset_id": spec.preset.pk if spec.preset is not None else None,
            "idle_timeout_seconds": spec.idle_timeout_seconds,
            "service_port": NOTEBOOK_PORT if spec.kind == WorkloadKind.NOTEBOOK else None,
            "submitted_at": now,
            "created_at": now,
            "updated_at": now,
            "idempotency_key": key,
            "request_fingerprint": digest,
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
