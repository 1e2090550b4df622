"""Requests for more quota or budget: asked with a reason and an end date, decided, taken back at the end.

Who does what:
- ask: a member of the project (tenant admins and operators for any
  project); a request for the tenant's own quota or budget, by its admins;
- approve or refuse: tenant admins for a project's request, operators for
  the tenant's own (operators may decide on any);
- cancel: the requester, or anyone who may decide on it, while it is pending.

Approving applies the increase through the quota and budget services (their
rules hold: a project's quota stays within the tenant's) and records what
was in force before (`previous`) and what the approval set (`granted`). At
`ends_at` the periodic task `accounting.expire_increase_requests` takes back
exactly what was granted: the previous values when nothing changed since,
else the current values less the increase (another increase granted since
stays). Every state change is a compare-and-swap on the request's state, so
two deciders, or two expiry workers, never both act.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from accounting.choices import REQUEST_TRANSITIONS, BudgetUnit, RequestKind, RequestState
from accounting.models import Budget, IncreaseRequest
from accounting.services import budgets
from common.errors import Conflict, FieldErrors, add_errors, invalid, raise_errors
from inventory.models import NodePool
from notifications.services import notify_request_decided
from tenants.choices import Role
from tenants.context import SYSTEM, Actor
from tenants.models import MAX_GPUS, Membership, Project, ProjectQuota, Tenant, TenantQuota
from tenants.scoping import tenant_id_scope, tenant_scope
from tenants.services import quotas
from tenants.services.access import require_operator, require_role
from tenants.services.audit import JsonDict, record_audit_event, update_audited

log = logging.getLogger(__name__)

MAX_DAYS = 366  # an increase for longer than a year is a new quota or budget, not a request


@dataclass(frozen=True)
class Ask:
    """What a request asks for. Quota: `pool` (by name), `guaranteed` and `limit` GPUs (the new values).
    Budget: `unit` (which of the owner's budgets) and the `extra` amount."""

    kind: str
    reason: str
    ends_at: datetime | None
    pool: str = ""
    guaranteed: int | None = None
    limit: int | None = None
    unit: str = ""
    extra: Decimal | str | None = None


# --- asking --------------------------------------------------------------------------------------------------


def _require_asker(actor: Actor, tenant: Tenant, project: Project | None) -> None:
    if project is None:
        require_role(actor, tenant, Role.ADMIN)
        return
    role = require_role(actor, tenant, Role.MEMBER)
    if role.at_least(Role.ADMIN):
        return
    with tenant_scope(tenant):
        assigned = Membership.objects.filter(user=actor.user, projects=project).exists()
    if not assigned:
        raise PermissionDenied(f"You are not a member of project {project.slug}; ask a tenant admin to add you.")


def ask_errors(tenant: Tenant, project: Project | None, ask: Ask, *, now: datetime) -> FieldErrors:
    """Return every rule `ask` breaks, by field (`reason`, `ends_at`, `kind`, `project`, `pool`, `guaranteed`,
    `limit`, `unit`, `extra`); empty when it may be asked."""
    errors: FieldErrors = {}
    if not ask.reason.strip():
        add_errors(errors, invalid("reason", "required", "Say why you need more."))
    elif len(ask.reason) > 2000:
        add_errors(errors, invalid("reason", "too_long", "At most 2000 characters."))
    if ask.ends_at is None:
        add_errors(errors, invalid("ends_at", "required", "Say until when you need it."))
    elif ask.ends_at <= now:
        add_errors(errors, invalid("ends_at", "in_the_past", "The end date must be in the future."))
    elif ask.ends_at > now + timedelta(days=MAX_DAYS):
        add_errors(errors, invalid("ends_at", "too_far", f"At most {MAX_DAYS} days ahead: ask for a new quota."))
    if project is not None and project.tenant_id != tenant.pk:
        add_errors(errors, invalid("project", "not_found", "No such project in this tenant."))
    elif ask.kind == RequestKind.QUOTA:
        _quota_ask_errors(tenant, project, ask, errors)
    elif ask.kind == RequestKind.BUDGET:
        _budget_ask_errors(tenant, project, ask, errors)
    else:
        add_errors(errors, invalid("kind", "invalid_choice", f"Choose one of {', '.join(RequestKind.values)}."))
    return errors


def _current_quota(tenant: Tenant, project: Project | None, pool: NodePool) -> TenantQuota | ProjectQuota | None:
    """Return the quota in `pool` of `project` (one of `tenant`'s), or `tenant`'s own for None."""
    with tenant_scope(tenant):
        if project is None:
            return TenantQuota.objects.filter(pool=pool).first()
        return ProjectQuota.objects.filter(project=project, pool=pool).first()


def _quota_ask_errors(tenant: Tenant, project: Project | None, ask: Ask, errors: FieldErrors) -> None:
    numbers = {"guaranteed": ask.guaranteed, "limit": ask.limit}
    for name, value in numbers.items():
        if value is None or isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GPUS:
            add_errors(errors, invalid(name, "out_of_range", f"Give a whole number of GPUs from 0 to {MAX_GPUS}."))
    if "limit" not in errors and "guaranteed" not in errors and (ask.limit or 0) < (ask.guaranteed or 0):
        add_errors(errors, invalid("limit", "limit_below_guaranteed", "The limit must be at least the guarantee."))
    pool = NodePool.objects.filter(name=ask.pool).first() if ask.pool else None
    if pool is None:
        add_errors(errors, invalid("pool", "not_found", f"There is no pool {ask.pool!r}."))
        return
    quota = _current_quota(tenant, project, pool)
    if quota is None:
        owner = "The tenant" if project is None else f"Project {project.slug}"
        add_errors(errors, invalid("pool", "no_quota", f"{owner} has no quota in pool {pool.name} to increase."))
    elif not errors and ask.guaranteed is not None and ask.limit is not None:
        if ask.guaranteed < quota.guaranteed or ask.limit < quota.limit:
            message = f"Ask for at least what is in force ({quota.guaranteed} guaranteed, limit {quota.limit})."
            add_errors(errors, invalid("limit", "not_more", message))
        elif (ask.guaranteed, ask.limit) == (quota.guaranteed, quota.limit):
            add_errors(errors, invalid("limit", "not_more", "That is what is in force already."))


def _budget_ask_errors(tenant: Tenant, project: Project | None, ask: Ask, errors: FieldErrors) -> None:
    if budgets.budget_errors({"amount": ask.extra}):
        add_errors(errors, invalid("extra", "invalid_amount", "Give an extra amount above 0, at most 4 decimals."))
    if ask.unit not in BudgetUnit.values:
        add_errors(errors, invalid("unit", "invalid_choice", f"Choose one of {', '.join(BudgetUnit.values)}."))
    elif _budget_of(tenant, project, ask.unit) is None:
        owner = "The tenant" if project is None else f"Project {project.slug}"
        add_errors(errors, invalid("unit", "no_budget", f"{owner} has no budget in that unit to increase."))


def _budget_of(tenant: Tenant, project: Project | None, unit: str) -> Budget | None:
    with tenant_scope(tenant):
        found = Budget.objects.filter(unit=unit)
        return (found.filter(project=project) if project is not None else found.filter(project__isnull=True)).first()


@transaction.atomic
def ask_for_more(*, actor: Actor, tenant: Tenant, project: Project | None, ask: Ask, now: datetime) -> IncreaseRequest:
    """Ask for more quota or budget for `project` (None: the tenant's own) until `ask.ends_at`; return the request.

    Raises Http404, PermissionDenied, or ValidationError naming every failing
    field at once (`ask_errors`), nothing written.
    """
    _require_asker(actor, tenant, project)
    raise_errors(ask_errors(tenant, project, ask, now=now))
    assert ask.ends_at is not None  # `ask_errors` requires it
    quota_kind = ask.kind == RequestKind.QUOTA
    with tenant_scope(tenant):
        request = IncreaseRequest.objects.create(
            tenant=tenant,
            project=project,
            requester=actor.user,
            kind=ask.kind,
            pool=NodePool.objects.get(name=ask.pool) if quota_kind else None,
            asked_guaranteed=ask.guaranteed if quota_kind else None,
            asked_limit=ask.limit if quota_kind else None,
            budget=None if quota_kind else _budget_of(tenant, project, ask.unit),
            asked_extra=None if quota_kind else Decimal(str(ask.extra)),
            reason=ask.reason.strip(),
            ends_at=ask.ends_at,
        )
    record_audit_event(
        actor=actor, action="increase_request.create", obj=request, tenant_id=tenant.pk, after=_snapshot(request)
    )
    return request


def _snapshot(request: IncreaseRequest) -> JsonDict:
    return {
        "kind": request.kind,
        "project": request.project.slug if request.project is not None else None,
        "pool": request.pool.name if request.pool is not None else None,
        "asked_guaranteed": request.asked_guaranteed,
        "asked_limit": request.asked_limit,
        "unit": request.budget.unit if request.budget is not None else None,
        "asked_extra": str(request.asked_extra) if request.asked_extra is not None else None,
        "ends_at": request.ends_at.isoformat(),
        "state": request.state,
    }


# --- deciding ------------------------------------------------------------------------------------------------


def require_decider(actor: Actor, request: IncreaseRequest) -> None:
    """Raise unless `actor` may decide on `request`: tenant admins on a project's, operators on the tenant's own.

    Http404 when it cannot see the tenant, PermissionDenied when it may not decide.
    """
    if request.project is None:
        require_role(actor, request.tenant, Role.VIEWER)
        require_operator(actor)
    else:
        require_role(actor, request.tenant, Role.ADMIN)


def _locked(request: IncreaseRequest) -> IncreaseRequest:
    with tenant_id_scope(request.tenant_id):
        return (
            IncreaseRequest.objects.select_for_update(of=("self",))
            .select_related("tenant", "project", "pool", "budget")
            .get(pk=request.pk)
        )


def _move(request: IncreaseRequest, target: RequestState, **fields: Any) -> None:
    """Compare-and-swap `request` from its current state to `target`; raises Conflict when another got there
    first, ForbiddenTransition when REQUEST_TRANSITIONS does not allow the move (callers check the state first)."""
    with tenant_id_scope(request.tenant_id):
        moved = REQUEST_TRANSITIONS.move(
            IncreaseRequest.objects.filter(pk=request.pk), from_states=[request.state], to_state=target, **fields
        )
    if moved != 1:
        raise Conflict("The request changed meanwhile; reload it.", code="request_changed")
    for name, value in fields.items():
        setattr(request, name, value)
    request.state = target


def _require_pending(request: IncreaseRequest, now: datetime) -> None:
    if request.state != RequestState.PENDING:
        raise Conflict(
            f"This request is {request.state}: only a pending one can be decided or cancelled.",
            code="request_not_pending",
            details={"state": request.state},
        )
    if request.ends_at <= now:
        raise Conflict("This request's end date has passed: it expires undecided.", code="request_ended")


@transaction.atomic
def approve_request(*, actor: Actor, request: IncreaseRequest, now: datetime, note: str = "") -> IncreaseRequest:
    """Approve a pending request: apply the increase and record what was in force; return the request.

    Raises Http404, PermissionDenied, Conflict (`request_not_pending`,
    `request_ended`, `request_changed`, `budget_gone`), or the quota's or
    budget's ValidationError when the increase breaks one of their rules
    (a project's quota above its tenant's, say), nothing written.
    """
    locked = _locked(request)
    require_decider(actor, locked)
    _require_pending(locked, now)
    previous, granted = _apply(actor, locked)
    _move(
        locked,
        RequestState.APPROVED,
        decided_by=actor.user,
        decided_at=now,
        decision_note=note.strip()[:2000],
        previous=previous,
        granted=granted,
    )
    record_audit_event(
        actor=actor,
        action="increase_request.approve",
        obj=locked,
        tenant_id=locked.tenant_id,
        before={"state": RequestState.PENDING},
        after={**_snapshot(locked), "granted": granted},
    )
    tell_requester(locked)
    return locked


@transaction.atomic
def refuse_request(*, actor: Actor, request: IncreaseRequest, now: datetime, note: str = "") -> IncreaseRequest:
    """Refuse a pending request, with an optional note for the requester; return it. Raises as `approve_request`."""
    locked = _locked(request)
    require_decider(actor, locked)
    _require_pending(locked, now)
    _move(locked, RequestState.REFUSED, decided_by=actor.user, decided_at=now, decision_note=note.strip()[:2000])
    record_audit_event(
        actor=actor,
        action="increase_request.refuse",
        obj=locked,
        tenant_id=locked.tenant_id,
        before={"state": RequestState.PENDING},
        after=_snapshot(locked),
    )
    tell_requester(locked)
    return locked


@transaction.atomic
def cancel_request(*, actor: Actor, request: IncreaseRequest, now: datetime) -> IncreaseRequest:
    """Withdraw a pending request: its requester, or anyone who may decide on it. Raises as `approve_request`."""
    locked = _locked(request)
    is_requester = actor.user is not None and locked.requester_id == actor.user.pk
    if is_requester:
        require_role(actor, locked.tenant, Role.MEMBER)
    else:
        require_decider(actor, locked)
    if locked.state != RequestState.PENDING:
        raise Conflict(
            f"This request is {locked.state}: only a pending one can be cancelled.",
            code="request_not_pending",
            details={"state": locked.state},
        )
    _move(locked, RequestState.CANCELLED)
    record_audit_event(
        actor=actor,
        action="increase_request.cancel",
        obj=locked,
        tenant_id=locked.tenant_id,
        before={"state": RequestState.PENDING},
        after=_snapshot(locked),
    )
    return locked


def tell_requester(request: IncreaseRequest) -> None:
    """Tell the requester (and the tenant's subscribed webhooks) that `request` was decided; in the decision's
    transaction, sent once it commits."""
    decider = request.decided_by
    notify_request_decided(
        tenant=request.tenant,
        request_id=request.pk,
        requester_id=request.requester_id,
        what=request.audit_label(),
        state=request.state,
        decided_by=decider.get_username() if decider is not None else "an operator",
        note=request.decision_note,
    )


# --- applying and taking back --------------------------------------------------------------------------------


def _apply(actor: Actor, request: IncreaseRequest) -> tuple[JsonDict, JsonDict]:
    """Apply the increase as `actor` through the quota or budget service; return (previous, granted)."""
    if request.kind == RequestKind.BUDGET:
        budget = _budget_by_id(request.tenant_id, request.budget_id) if request.budget_id else None
        if budget is None:
            raise Conflict("The budget this request is for no longer exists.", code="budget_gone")
        assert request.asked_extra is not None  # a database constraint
        changed = budgets.update_budget(
            actor=actor, budget=budget, changes={"amount": budget.amount + request.asked_extra}
        )
        return {"amount": str(budget.amount)}, {"amount": str(changed.amount)}
    assert request.pool is not None  # a database constraint
    quota = _current_quota(request.tenant, request.project, request.pool)
    if quota is None:
        raise Conflict("The quota this request is for no longer exists.", code="quota_gone")
    before = {"guaranteed": quota.guaranteed, "limit": quota.limit}
    after = {
        "guaranteed": max(quota.guaranteed, request.asked_guaranteed or 0),
        "limit": max(quota.limit, request.asked_limit or 0),
    }
    if isinstance(quota, TenantQuota):
        quotas.update_tenant_quota(actor=actor, quota=quota, changes=after)
    else:
        quotas.update_project_quota(actor=actor, quota=quota, changes=after)
    return before, after


def _budget_by_id(tenant_id: int, budget_id: int) -> Budget | None:
    """Return budget `budget_id` of tenant `tenant_id` (a request's), or None when it is gone."""
    with tenant_id_scope(tenant_id):
        return Budget.objects.filter(pk=budget_id).first()


def open_requests_ended(now: datetime) -> list[int]:
    """Return the ids of pending and approved requests whose end date has come, oldest end first."""
    ended = IncreaseRequest.all_tenants.filter(
        state__in=[RequestState.PENDING, RequestState.APPROVED], ends_at__lte=now
    ).order_by("ends_at", "id")
    return list(ended.values_list("id", flat=True))


def expire_requests(*, now: datetime) -> int:
    """Expire every request whose end date has come, each in its own transaction; return how many expired.

    Idempotent: a request another worker expired meanwhile is skipped. An
    approved one that cannot be taken back now (a tenant quota whose
    projects' limits were raised above the previous limit) keeps its
    increase, says why in `expiry_problem`, and is tried again next time.
    """
    expired = 0
    for request_id in open_requests_ended(now):
        try:
            expired += expire_request(request_id=request_id, now=now)
        except ValidationError as error:
            problem = "; ".join(error.messages)
            IncreaseRequest.all_tenants.filter(pk=request_id).update(expiry_problem=problem[:2000])
            log.warning("increase request %s could not be taken back: %s", request_id, problem)
    return expired


@transaction.atomic
def expire_request(*, request_id: int, now: datetime) -> bool:
    """Expire one request whose end date has come: take back what an approval granted; return whether it moved."""
    locked = (
        IncreaseRequest.all_tenants.select_for_update(of=("self",))
        .select_related("tenant", "project", "pool")
        .filter(pk=request_id, state__in=[RequestState.PENDING, RequestState.APPROVED], ends_at__lte=now)
        .first()
    )
    if locked is None:
        return False  # expired, cancelled or decided elsewhere meanwhile
    restored: JsonDict | None = None
    if locked.state == RequestState.APPROVED:
        restored = _take_back(locked)
    before = {"state": locked.state}
    _move(locked, RequestState.EXPIRED, expired_at=now, expiry_problem="")
    record_audit_event(
        actor=SYSTEM,
        action="increase_request.expire",
        obj=locked,
        tenant_id=locked.tenant_id,
        before=before,
        after={"state": RequestState.EXPIRED, "restored": restored},
    )
    return True


def _take_back(request: IncreaseRequest) -> JsonDict | None:
    """Take back what `request`'s approval granted, as the system; return the values restored (None: nothing to)."""
    previous, granted = request.previous or {}, request.granted or {}
    if request.kind == RequestKind.BUDGET:
        with tenant_id_scope(request.tenant_id):
            budget = Budget.objects.select_for_update(of=("self",)).select_related("tenant", "project")
            found = budget.filter(pk=request.budget_id).first() if request.budget_id else None
        if found is None:
            return None  # the budget is gone: nothing to take back
        amount = _less(found.amount, Decimal(granted["amount"]), Decimal(previous["amount"]))
        if amount <= 0:
            amount = found.amount  # lowered since by more than the increase: what was set since stands
        update_audited(
            actor=SYSTEM,
            action="budget.update",
            obj=found,
            changes={"amount": amount},
            tenant_id=found.tenant_id,
            audited=budgets.budget_snapshot,
        )
        return {"amount": str(amount)}
    assert request.pool is not None  # a database constraint
    quota = _current_quota(request.tenant, request.project, request.pool)
    if quota is None:
        return None
    guaranteed = max(0, _less(quota.guaranteed, granted["guaranteed"], previous["guaranteed"]))
    limit = max(guaranteed, _less(quota.limit, granted["limit"], previous["limit"]))
    if isinstance(quota, TenantQuota):
        _check_projects_fit(quota, limit)
    update_audited(
        actor=SYSTEM,
        action=f"{'tenant' if isinstance(quota, TenantQuota) else 'project'}_quota.update",
        obj=quota,
        changes={"guaranteed": guaranteed, "limit": limit},
        tenant_id=quota.tenant_id,
        audited=["guaranteed", "limit"],
    )
    return {"guaranteed": guaranteed, "limit": limit}


def _less(current: Any, granted: Any, previous: Any) -> Any:
    """Return `current` less what was granted: the previous value exactly when nothing changed since."""
    return previous if current == granted else current - (granted - previous)


def _check_projects_fit(quota: TenantQuota, limit: int) -> None:
    """Raise ValidationError when a project's limit in the pool is above the tenant limit to restore."""
    with tenant_id_scope(quota.tenant_id):
        highest = max((q.limit for q in ProjectQuota.objects.filter(pool_id=quota.pool_id) if q.has_limit), default=0)
    if limit < highest:
        raise invalid(
            "limit",
            "below_project_limit",
            f"A project in pool {quota.pool.name} has a limit of {highest}, above the tenant's limit of {limit} "
            "to restore; lower it and the increase ends.",
        )


def ask_from(data: Mapping[str, Any]) -> Ask:
    """Return the Ask in `data` (an interface's parsed input): missing fields are left at their defaults."""
    return Ask(
        kind=str(data.get("kind", "")),
        reason=str(data.get("reason", "")),
        ends_at=data.get("ends_at"),
        pool=str(data.get("pool") or ""),
        guaranteed=data.get("guaranteed"),
        limit=data.get("limit"),
        unit=str(data.get("unit") or ""),
        extra=data.get("extra"),
    )
