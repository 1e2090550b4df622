"""The audit log writer: one event per state-changing action, in the action's transaction."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any, TypeVar

from django.db import models

from common import fast_bulk
from common.errors import FieldErrors, gather, raise_errors
from tenants.context import Actor, RequestInfo, current_request_info
from tenants.models import AuditEvent
from tenants.services.validation import clean_fields

JsonDict = dict[str, Any]
M = TypeVar("M", bound=models.Model)


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, models.Model):
        return value.pk
    return value


def snapshot(obj: models.Model, fields: Sequence[str]) -> JsonDict:
    """Return the named fields of `obj` as a JSON-ready dict (foreign keys as ids)."""
    return {name: _json_value(getattr(obj, name)) for name in fields}


def audit_label(obj: models.Model) -> str:
    """Return how the audit log names `obj` for people: its `audit_label()` where the model has one
    (names, not ids: a membership is its user name), else `str(obj)`. Kept on the event, so the name
    stays as it was when the change was made."""
    label = getattr(obj, "audit_label", None)
    return str(label()) if callable(label) else str(obj)


def record_audit_event(
    *,
    actor: Actor,
    action: str,
    obj: models.Model,
    tenant_id: int | None,
    before: JsonDict | None = None,
    after: JsonDict | None = None,
) -> AuditEvent:
    """Write one audit event for `action` on `obj` and return it.

    Call it inside the action's transaction so the event and the change
    commit or roll back together. Request id, address and interface come
    from the request in progress (empty for CLI and workers).
    """
    event = audit_event(actor=actor, action=action, obj=obj, tenant_id=tenant_id, before=before, after=after)
    event.save(force_insert=True)
    return event


def update_audited(
    *,
    actor: Actor,
    action: str,
    obj: M,
    changes: Mapping[str, Any],
    tenant_id: int | None,
    audited: Sequence[str] | Callable[[M], JsonDict],
    errors: FieldErrors | None = None,
) -> M:
    """Apply `changes` (field name: new value) to `obj`, save them, write one audit event; return `obj`.

    Run it inside the caller's transaction, on `obj` as read under its row
    lock, once the caller's own rules (permissions, rules across fields or
    rows) have passed: the change and its event commit or roll back together.

    - Validated: the changed fields against their declared rules
      (`clean_fields`: no uniqueness, no constraints); one ValidationError
      names every failing field, with the `errors` of the caller's own rules
      beside them, and nothing has been written by then.
    - Saved: `obj.save(update_fields=...)` with the changed fields and the
      `auto_now` ones, then `set()` on each many-to-many field in `changes`.
    - Audited: `action` on `obj` for `tenant_id`, with `before` and `after`
      the state `audited` describes (field names for `snapshot`, or a function
      returning the snapshot) before the first assignment and after the last write.
    """
    before = _state(obj, audited)
    related = {field.name for field in obj._meta.many_to_many}
    columns = [name for name in changes if name not in related]
    for name in columns:
        setattr(obj, name, changes[name])
    found: FieldErrors = dict(errors or {})
    # A field the caller's rules already refused is not judged twice.
    unchecked = [f.name for f in obj._meta.fields if f.name not in columns or f.name in found]
    gather(found, lambda: clean_fields(obj, exclude=unchecked))
    raise_errors(found)
    stamped = [field.name for field in obj._meta.concrete_fields if getattr(field, "auto_now", False)]
    obj.save(update_fields=[*columns, *stamped])
    for name in changes:
        if name in related:
            getattr(obj, name).set(changes[name])
    record_audit_event(
        actor=actor, action=action, obj=obj, tenant_id=tenant_id, before=before, after=_state(obj, audited)
    )
    return obj


def delete_audited(
    *, actor: Actor, action: str, obj: M, tenant_id: int | None, audited: Sequence[str] | Callable[[M], JsonDict]
) -> None:
    """Write one audit event with `obj`'s state as `before` (as `update_audited` describes it), then delete `obj`.

    Run it inside the caller's transaction, once the caller's own rules have
    passed: a deletion the database refuses (a protected reference) rolls
    the event back with it.
    """
    record_audit_event(actor=actor, action=action, obj=obj, tenant_id=tenant_id, before=_state(obj, audited))
    obj.delete()


def _state(obj: M, audited: Sequence[str] | Callable[[M], JsonDict]) -> JsonDict:
    return audited(obj) if callable(audited) else snapshot(obj, audited)


def audit_event(
    *,
    actor: Actor,
    action: str,
    obj: models.Model,
    tenant_id: int | None,
    before: JsonDict | None = None,
    after: JsonDict | None = None,
    info: RequestInfo | None = None,
) -> AuditEvent:
    """Return the audit event `record_audit_event` would write, unsaved, for `record_audit_events`.

    `info` is the request the action came through; None means the request in progress.
    """
    if info is None:
        info = current_request_info()
    return AuditEvent(
        tenant_id=tenant_id,
        actor=actor.user,
        actor_label=actor.label,
        token_prefix=actor.token.prefix if actor.token is not None else "",
        via=info.via,
        action=action,
        object_type=obj._meta.model_name or type(obj).__name__.lower(),
        object_id=str(obj.pk) if obj.pk is not None else "",
        object_repr=audit_label(obj)[:200],
        before=before,
        after=after,
        request_id=info.request_id,
        source_ip=info.source_ip,
    )


def record_audit_events(events: Sequence[AuditEvent]) -> None:
    """Write events built by `audit_event` in one statement, inside the actions' transaction."""
    fast_bulk.insert(events)
