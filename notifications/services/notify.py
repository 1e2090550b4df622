"""Raising notifications: `notify` and the named events other apps call.

Every function here writes in the caller's transaction and sends nothing
itself: one Notification and one Delivery per listener are rows of the
caller's change, and sending starts when it commits. When nobody listens
they write nothing and cost two small indexed reads (the endpoints of the
tenant, and the choices of the people named).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.utils import timezone

from notifications import selectors
from notifications.choices import Channel, EventKind
from notifications.models import Delivery, Notification, WebhookEndpoint
from notifications.selectors import Recipient
from notifications.services.sending import enqueue_on_commit
from tenants.choices import Role
from tenants.models import Tenant

Users = QuerySet[User] | Iterable[User | int]
MAX_SUBJECT = 200
MAX_BODY = 10000


@dataclass(frozen=True)
class Listeners:
    """Who hears about one event: e-mail recipients and webhook endpoints."""

    recipients: list[Recipient]
    endpoints: list[WebhookEndpoint]

    def __bool__(self) -> bool:
        return bool(self.recipients or self.endpoints)


def _people(users: Users) -> QuerySet[User] | None:
    if isinstance(users, QuerySet):
        return users
    ids = [user if isinstance(user, int) else user.pk for user in users]
    return User.objects.filter(pk__in=ids) if ids else None


def listeners(kind: EventKind | str, *, tenant_id: int | None, users: Users = ()) -> Listeners:
    """Return who listens for `kind` in `tenant_id` (the platform for None) among `users` and the endpoints.

    Raises ValueError for a kind that is not the tenant's (or the
    platform's): a bug in the caller, not an input error.
    """
    event = EventKind(kind)
    if event not in selectors.kinds_for(tenant_id):
        where = "a tenant's" if tenant_id is not None else "the platform's"
        raise ValueError(f"{event} is not one of {where} event kinds")
    endpoints = selectors.subscribed_endpoints(event, tenant_id)
    people = _people(users) if settings.NOTIFICATIONS_EMAIL else None
    recipients = selectors.email_recipients(event, tenant_id, people) if people is not None else []
    return Listeners(recipients=recipients, endpoints=endpoints)


def _record(
    kind: EventKind, tenant: Tenant | None, found: Listeners, *, subject: str, body: str, payload: Mapping[str, Any]
) -> Notification:
    now = timezone.now()
    tenant_id = tenant.pk if tenant is not None else None
    notification = selectors.owned_by(Notification, tenant_id).create(
        tenant=tenant, kind=kind, subject=subject[:MAX_SUBJECT], body=body[:MAX_BODY], payload=dict(payload),
        created_at=now,
    )  # fmt: skip
    common = {"tenant": tenant, "notification": notification, "next_attempt_at": now, "created_at": now}
    deliveries = [
        Delivery(channel=Channel.EMAIL, user_id=r.user_id, address=r.address, **common) for r in found.recipients
    ] + [Delivery(channel=Channel.WEBHOOK, endpoint=e, address=e.url, **common) for e in found.endpoints]
    selectors.owned_by(Delivery, tenant_id).bulk_create(deliveries)
    enqueue_on_commit([delivery.pk for delivery in deliveries])
    return notification


def notify(
    kind: EventKind | str,
    *,
    tenant: Tenant | None = None,
    users: Users = (),
    subject: str,
    body: str,
    payload: Mapping[str, Any],
) -> Notification | None:
    """Notify whoever listens for `kind`; return the Notification, or None when nobody listens.

    Listeners: each of `users` (users, their ids, or a queryset) whose
    choice for `kind` in `tenant` (the platform's kinds when `tenant` is
    None) says e-mail, with an active account and an address, while e-mail
    is on (NOTIFICATIONS_EMAIL); and every active webhook endpoint of
    `tenant` (of the platform when None) subscribed to `kind`. E-mails carry
    `subject` and `body`; webhooks a JSON body with `payload` (JSON-ready
    values only) as `data`. Writes one Notification and one Delivery per
    listener in the caller's transaction and enqueues the sending on commit.
    Raises ValueError for a kind that is not the tenant's (or the platform's).
    """
    event = EventKind(kind)
    found = listeners(event, tenant_id=tenant.pk if tenant is not None else None, users=users)
    if not found:
        return None
    return _record(event, tenant, found, subject=subject, body=body, payload=payload)


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def tenant_admins(tenant: Tenant) -> QuerySet[User]:
    """Return the admins of `tenant`: who hears about its budgets unless the caller names others."""
    return User.objects.filter(memberships__tenant=tenant, memberships__role=Role.ADMIN)


def _budget(
    kind: EventKind,
    *,
    tenant: Tenant,
    budget_id: int,
    label: str,
    unit: str,
    used: Decimal,
    amount: Decimal,
    percent: int,
    period_start: datetime,
    period_end: datetime,
    users: Users | None,
) -> Notification | None:
    found = listeners(kind, tenant_id=tenant.pk, users=tenant_admins(tenant) if users is None else users)
    if not found:
        return None
    reached = "is used up" if kind == EventKind.BUDGET_EXHAUSTED else f"has reached {percent} %"
    subject = f"{tenant.name}: budget of {label} {reached}"
    body = (
        f"The budget of {label} in {tenant.name} ({tenant.slug}) {reached}: {used} of {amount} {unit} used "
        f"between {_utc(period_start)} and {_utc(period_end)}."
    )
    payload = {
        "budget": {"id": budget_id, "label": label, "unit": unit, "amount": str(amount)},
        "used": str(used),
        "percent": percent,
        "period": {"start": _utc(period_start), "end": _utc(period_end)},
    }
    return _record(kind, tenant, found, subject=subject, body=body, payload=payload)


def notify_budget_threshold(
    *,
    tenant: Tenant,
    budget_id: int,
    label: str,
    unit: str,
    used: Decimal,
    amount: Decimal,
    percent: int,
    period_start: datetime,
    period_end: datetime,
    users: Users | None = None,
) -> Notification | None:
    """Announce that a budget reached its soft threshold (`percent` of `amount`) in the period; return the
    Notification, or None when nobody listens.

    `label` names the budget for people ("project alpha (GPU-hours)"),
    `unit` is what `used` and `amount` count. `users` default to the
    tenant's admins. Call it once per threshold and period, in the
    transaction that claims the announcement.
    """
    return _budget(
        EventKind.BUDGET_THRESHOLD, tenant=tenant, budget_id=budget_id, label=label, unit=unit, used=used,
        amount=amount, percent=percent, period_start=period_start, period_end=period_end, users=users,
    )  # fmt: skip


def notify_budget_exhausted(
    *,
    tenant: Tenant,
    budget_id: int,
    label: str,
    unit: str,
    used: Decimal,
    amount: Decimal,
    period_start: datetime,
    period_end: datetime,
    users: Users | None = None,
) -> Notification | None:
    """Announce that a budget is used up (100 %) in the period; as `notify_budget_threshold` otherwise."""
    return _budget(
        EventKind.BUDGET_EXHAUSTED, tenant=tenant, budget_id=budget_id, label=label, unit=unit, used=used,
        amount=amount, percent=100, period_start=period_start, period_end=period_end, users=users,
    )  # fmt: skip


def notify_request_decided(
    *,
    tenant: Tenant,
    request_id: int,
    requester_id: int | None,
    what: str,
    state: str,
    decided_by: str,
    note: str = "",
) -> Notification | None:
    """Tell the requester (and the tenant's subscribed webhooks) that increase request `request_id` was decided.

    `what` names the request for people ("quota increase for project
    alpha"), `state` is the decision (`approved`, `refused`), `decided_by`
    who made it. Returns the Notification, or None when nobody listens.
    """
    found = listeners(
        EventKind.REQUEST_DECIDED, tenant_id=tenant.pk, users=[requester_id] if requester_id is not None else []
    )
    if not found:
        return None
    subject = f"{tenant.name}: your {what} was {state}"
    body = f"Your {what} in {tenant.name} ({tenant.slug}) was {state} by {decided_by}." + (
        f"\n\nNote: {note}" if note else ""
    )
    payload = {"request": {"id": request_id, "what": what}, "state": state, "decided_by": decided_by, "note": note}
    return _record(EventKind.REQUEST_DECIDED, tenant, found, subject=subject, body=body, payload=payload)


def notify_idle_warning(
    *, tenant: Tenant, owner_id: int, workload_id: int, name: str, stop_at: datetime, message: str
) -> Notification | None:
    """Warn the owner of idle notebook `workload_id` (and subscribed webhooks) that it stops at `stop_at`;
    `message` is the warning as the notebook's timeline shows it. Returns the Notification, or None."""
    found = listeners(EventKind.IDLE_WARNING, tenant_id=tenant.pk, users=[owner_id])
    if not found:
        return None
    subject = f"Notebook {name} is idle and will be hibernated at {stop_at.astimezone(UTC):%H:%M} UTC"
    body = f"{message}\n\nNotebook {name} (#{workload_id}) in {tenant.name} ({tenant.slug})."
    payload = {
        "workload": {"id": workload_id, "name": name, "kind": "notebook"},
        "owner": _username(owner_id),
        "stop_at": _utc(stop_at),
        "message": message,
    }
    return _record(EventKind.IDLE_WARNING, tenant, found, subject=subject, body=body, payload=payload)


def _username(user_id: int | None) -> str | None:
    if user_id is None:
        return None
    return User.objects.filter(pk=user_id).values_list("username", flat=True).first()


def notify_workload_ended(
    *,
    tenant_id: int,
    owner_id: int,
    workload_id: int,
    name: str,
    workload_kind: str,
    failed: bool,
    reason_code: str,
    message: str,
) -> Notification | None:
    """Tell the owner (when they opted in) and subscribed webhooks that a workload succeeded or failed.

    Called by the workload transition itself, inside its transaction, so it
    takes what that already read; the tenant and the owner's name are read
    only when somebody listens. Returns the Notification, or None.
    """
    kind = EventKind.WORKLOAD_FAILED if failed else EventKind.WORKLOAD_FINISHED
    found = listeners(kind, tenant_id=tenant_id, users=[owner_id])
    if not found:
        return None
    tenant = Tenant.objects.get(pk=tenant_id)
    what = "Job" if workload_kind == "job" else "Notebook"
    outcome = "failed" if failed else "finished"
    subject = f"{what} {name} {outcome}"
    body = f"{what} {name} (#{workload_id}) in {tenant.name} ({tenant.slug}) {outcome}: {message}"
    payload = {
        "workload": {"id": workload_id, "name": name, "kind": workload_kind},
        "owner": _username(owner_id),
        "state": "failed" if failed else "succeeded",
        "reason_code": reason_code,
        "message": message,
    }
    return _record(kind, tenant, found, subject=subject, body=body, payload=payload)


def notify_work_stopped(
    *, tenant: Tenant, owner_id: int, workload_id: int, name: str, workload_kind: str, state: str, message: str
) -> Notification | None:
    """Tell a workload's owner, the tenant's admins (each as they chose) and subscribed webhooks that the
    platform stopped it because its owner lost access; `message` is the reason its timeline shows.
    Returns the Notification, or None when nobody listens.

    It is a `workload.stopped` event (reason_code ACCESS_REVOKED), heard by
    default unlike `workload.failed`: the owner did not cause it.
    """
    people = {owner_id, *tenant_admins(tenant).values_list("pk", flat=True)}
    found = listeners(EventKind.WORKLOAD_STOPPED, tenant_id=tenant.pk, users=sorted(people))
    if not found:
        return None
    what = "Job" if workload_kind == "job" else "Notebook"
    subject = f"{what} {name} was stopped"
    body = f"{what} {name} (#{workload_id}) in {tenant.name} ({tenant.slug}): {message}"
    payload = {
        "workload": {"id": workload_id, "name": name, "kind": workload_kind},
        "owner": _username(owner_id),
        "state": state,
        "reason_code": "ACCESS_REVOKED",
        "message": message,
    }
    return _record(EventKind.WORKLOAD_STOPPED, tenant, found, subject=subject, body=body, payload=payload)


def notify_node_health(*, node: str, summary: str, data: Mapping[str, Any]) -> Notification | None:
    """Tell operators (by e-mail, as each chose) and platform webhooks about a health change of `node`.

    `summary` says what happened in words ("GPU 3 failed: XID 79"), `data`
    the facts for machines (JSON-ready). Returns the Notification, or None.
    """
    found = listeners(EventKind.NODE_HEALTH, tenant_id=None, users=selectors.operators())
    if not found:
        return None
    payload = {"node": node, **dict(data), "summary": summary}
    return _record(
        EventKind.NODE_HEALTH,
        None,
        found,
        subject=f"Node {node}: {summary}"[:MAX_SUBJECT],
        body=summary,
        payload=payload,
    )
