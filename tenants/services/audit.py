"""The audit log writer: one event per state-changing action, in the action's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.db import models

from gpucloud import bulk
from tenants.context import Actor, RequestInfo, current_request_info
from tenants.models import AuditEvent

JsonDict = dict[str, Any]


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, models.Model):
        return value.pk
    return value


def snapshot(obj: models.Model, fields: list[str]) -> JsonDict:
    """Return the named fields of `obj` as a JSON-ready dict (foreign keys as ids)."""
    return {name: _json_value(getattr(obj, name)) for name in fields}


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
        object_repr=str(obj)[:200],
        before=before,
        after=after,
        request_id=info.request_id,
        source_ip=info.source_ip,
    )


def record_audit_events(events: Sequence[AuditEvent]) -> None:
    """Write events built by `audit_event` in one statement, inside the actions' transaction."""
    bulk.insert(events)
