"""The tenant's audit log for its admins: who did what to which subject, filtered, and exported as CSV.

Events written since subjects got readable labels (`tenants.services.audit.audit_label`)
and name-based snapshots carry those names as they were; older events name
users, pools and projects by id, which this page resolves to today's names
where they still exist (and shows as `#id` where they do not).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from itertools import islice
from typing import Any

from django.contrib.auth.models import User
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render

from frontend.access import Page, tenant_view
from frontend.forms.tenancy import AuditFilterForm
from inventory.models import NodePool
from tenants import selectors
from tenants.choices import Role
from tenants.models import NO_LIMIT, AuditEvent, Project, Tenant
from tenants.scoping import tenant_scope

# What people call each kind of subject; a kind missing here shows as stored.
SUBJECT_KINDS = {
    "membership": "member",
    "tenantquota": "tenant quota",
    "projectquota": "project quota",
    "apitoken": "API token",
    "nodepool": "pool",
    "launchpreset": "preset",
}
FIELD_NAMES = {
    "guaranteed": "guaranteed GPUs",
    "limit": "GPU limit",
    "max_notebooks_per_user": "notebooks per user",
    "max_pending_workloads": "pending workloads",
    "max_runtime_seconds": "max runtime (s)",
}
# How events written before readable labels named memberships ("3@1:member") and quotas ("2/1: 1..2").
_OLD_MEMBERSHIP = re.compile(r"^(\d+)@\d+:\w+$")
_OLD_QUOTA = re.compile(r"^(\d+)/(\d+): \d+\.\.\d+$")
CSV_CHUNK = 500
PAGE_SIZE = 50


@dataclass(frozen=True)
class Change:
    """One field of a subject as it was before and after the action (None: not there on that side)."""

    name: str
    before: str | None
    after: str | None

    def __str__(self) -> str:
        if self.before is None:
            return f"{self.name}: {self.after}"
        if self.after is None:
            return f"{self.name} was {self.before}"
        return f"{self.name}: {self.before} → {self.after}"


@dataclass(frozen=True)
class AuditRow:
    """An audit event as people read it: its subject by name and what changed."""

    event: AuditEvent
    subject: str
    changes: list[Change]

    @property
    def summary(self) -> str:
        return "; ".join(str(change) for change in self.changes)


@dataclass
class _Names:
    """Today's names of the users, pools and projects that old events name by id; one query per kind."""

    users: dict[int, str] = field(default_factory=dict)
    pools: dict[int, str] = field(default_factory=dict)
    projects: dict[int, str] = field(default_factory=dict)

    @classmethod
    def for_events(cls, events: list[AuditEvent], tenant: Tenant) -> _Names:
        wanted: dict[str, set[int]] = {"users": set(), "pools": set(), "projects": set()}
        for event in events:
            _collect_ids(event, wanted)
        users = dict(User.objects.filter(pk__in=wanted["users"]).values_list("pk", "username"))
        pools = dict(NodePool.objects.filter(pk__in=wanted["pools"]).values_list("pk", "name"))
        # The tenant's own scope rather than the request's: the CSV export reads after the view has returned.
        with tenant_scope(tenant):
            projects = dict(Project.objects.filter(pk__in=wanted["projects"]).values_list("pk", "slug"))
        return cls(users=users, pools=pools, projects=projects)

    def of(self, kind: str, pk: int) -> str:
        return getattr(self, kind).get(pk) or f"#{pk}"


def _collect_ids(event: AuditEvent, wanted: dict[str, set[int]]) -> None:
    old_membership = _OLD_MEMBERSHIP.match(event.object_repr)
    if event.object_type == "membership" and old_membership:
        wanted["users"].add(int(old_membership[1]))
    old_quota = _OLD_QUOTA.match(event.object_repr)
    if event.object_type in {"tenantquota", "projectquota"} and old_quota:
        wanted["pools"].add(int(old_quota[2]))
        if event.object_type == "projectquota":
            wanted["projects"].add(int(old_quota[1]))
    for state in (event.before, event.after):
        if isinstance(state, dict):
            for key, kind in (("pool", "pools"), ("project", "projects")):
                if isinstance(state.get(key), int):
                    wanted[kind].add(state[key])


def _subject_label(event: AuditEvent, names: _Names, tenant_slug: str) -> str:
    """Return the subject's name: as recorded, or resolved from an old event's ids."""
    old_membership = _OLD_MEMBERSHIP.match(event.object_repr)
    old_quota = _OLD_QUOTA.match(event.object_repr)
    if event.object_type == "membership" and old_membership:
        return names.of("users", int(old_membership[1]))
    if event.object_type == "tenantquota" and old_quota:
        return f"{tenant_slug} in pool {names.of('pools', int(old_quota[2]))}"
    if event.object_type == "projectquota" and old_quota:
        return f"{names.of('projects', int(old_quota[1]))} in pool {names.of('pools', int(old_quota[2]))}"
    return event.object_repr or event.object_id


def _shown(name: str, value: Any, names: _Names) -> str:
    if value is None:
        return "none"
    if name == "limit" and value == NO_LIMIT:
        return "no limit"
    if name in {"pool", "project"} and isinstance(value, int):
        return names.of(f"{name}s", value)
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)


def _changes(event: AuditEvent, names: _Names) -> list[Change]:
    """Return the fields the action changed (all of them for a creation or a deletion): known fields in
    FIELD_NAMES' order, then the rest by name (Postgres' jsonb keeps no order of its own)."""
    before = event.before if isinstance(event.before, dict) else {}
    after = event.after if isinstance(event.after, dict) else {}
    both = before and after
    changes = []
    for key in sorted({*before, *after}, key=_field_order):
        if both and before.get(key) == after.get(key):
            continue
        # A creation or a deletion lists what the subject had, not every empty field it could have had.
        if not both and (before or after).get(key) in (None, "", []):
            continue
        label = FIELD_NAMES.get(key, key.replace("_", " "))
        changes.append(
            Change(
                label,
                _shown(key, before[key], names) if key in before else None,
                _shown(key, after[key], names) if key in after else None,
            )
        )
    return changes


def _field_order(key: str) -> tuple[int, str]:
    known = list(FIELD_NAMES)
    return (known.index(key), "") if key in FIELD_NAMES else (len(known), key)


def _kind(event: AuditEvent) -> str:
    return SUBJECT_KINDS.get(event.object_type, event.object_type)


def readable(events: Iterable[AuditEvent], tenant: Tenant) -> list[AuditRow]:
    """Return `tenant`'s `events` as people read them, resolving old events' ids in one query per kind."""
    listed = list(events)
    names = _Names.for_events(listed, tenant)
    return [
        AuditRow(
            event=event,
            subject=f"{_kind(event)} {_subject_label(event, names, tenant.slug)}",
            changes=_changes(event, names),
        )
        for event in listed
    ]


def _filtered(request: HttpRequest) -> tuple[AuditFilterForm, QuerySet[AuditEvent]]:
    """Return the filter form for the query string and the events it selects (all of them while it is invalid)."""
    form = AuditFilterForm(request.GET or None, actor_choices=selectors.audit_actors_in_scope())
    if not form.is_valid():
        # Unfiltered until a filter is asked for; nothing while the filter asked for is malformed.
        events = selectors.audit_events_in_scope()
        return form, events.none() if form.is_bound else events
    data = form.cleaned_data
    events = selectors.audit_events_matching(
        actor=data["actor"],
        subject=data["subject"],
        action=data["action"],
        since=_utc_midnight(data["since"], 0),
        until=_utc_midnight(data["until"], 1),
    )
    return form, events


def _utc_midnight(day: Any, days_after: int) -> datetime | None:
    if day is None:
        return None
    return datetime.combine(day + timedelta(days=days_after), time.min, tzinfo=UTC)


@tenant_view(Role.ADMIN)
def audit(request: HttpRequest, page: Page) -> HttpResponse:
    """The audit log, newest first, 50 a page, filtered by actor, subject, action and days."""
    form, events = _filtered(request)
    shown = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "page": page,
        "form": form,
        "events": shown,
        "rows": readable(shown.object_list, page.tenant),
        "query": query.urlencode(),
    }
    return render(request, "frontend/audit.html", context)


class _Echo:
    """A file the csv writer writes to that hands each line back instead of keeping it."""

    def write(self, value: str) -> str:
        return value


CSV_COLUMNS = ["time (UTC)", "actor", "token", "via", "action", "subject", "change", "request", "address"]


def _csv_lines(events: QuerySet[AuditEvent], tenant: Tenant) -> Iterator[str]:
    """Yield the CSV lines of `events` (whose query already names the tenant: this runs after the view)."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    stream = events.iterator(chunk_size=CSV_CHUNK)
    while chunk := list(islice(stream, CSV_CHUNK)):
        for row in readable(chunk, tenant):
            e = row.event
            yield writer.writerow(
                [
                    e.created_at.astimezone(UTC).isoformat(timespec="seconds"),
                    e.actor_label,
                    e.token_prefix,
                    e.get_via_display(),
                    e.action,
                    row.subject,
                    row.summary,
                    e.request_id,
                    e.source_ip or "",
                ]
            )


@tenant_view(Role.ADMIN)
def audit_export(request: HttpRequest, page: Page) -> HttpResponse:
    """The filtered audit log as CSV, streamed a chunk of rows at a time, so a large log never sits in memory."""
    _, events = _filtered(request)
    response = StreamingHttpResponse(_csv_lines(events, page.tenant), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="audit-{page.tenant.slug}.csv"'
    return response  # type: ignore[return-value]  # tenant_view types pages as HttpResponse; Django streams this alike
