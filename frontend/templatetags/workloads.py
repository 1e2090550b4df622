"""Template filters about workloads: reason codes and event kinds in people's words, with the code kept for those
who search it."""

from __future__ import annotations

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobs.choices import WorkloadState, event_kind_label
from jobs.selectors import reason_label

register = template.Library()


@register.filter(name="reason_label")
def reason_label_filter(code: str | None) -> str:
    """Return the label of a reason code (`jobs.choices.ReasonCode`): 'QUOTA_LIMIT' -> 'Quota limit reached'."""
    return reason_label(code) if code else ""


@register.filter
def reason(code: str | None) -> SafeString:
    """Return a reason code as its label in a `<span class="reason-code">` whose title is the code; '' for none."""
    if not code:
        return SafeString("")
    return format_html(
        '<span class="reason-code" title="{}" data-reason-code="{}">{}</span>', code, code, reason_label(code)
    )


@register.filter
def state_label(state: str | None) -> str:
    """Return a workload state's label ('scheduled' -> 'Scheduled'); an unknown state is returned as it is."""
    try:
        return str(WorkloadState(state or "").label)
    except ValueError:
        return state or ""


@register.filter
def event_kind(kind: str | None) -> SafeString:
    """Return a workload event kind as its label in a `<span class="event-kind">` whose title is the kind.

    'workload.image_pulled' -> Image pulled (`jobs.choices.WorkloadEventKind`); '' for none.
    """
    if not kind:
        return SafeString("")
    return format_html(
        '<span class="event-kind" title="{}" data-event-kind="{}">{}</span>', kind, kind, event_kind_label(kind)
    )
