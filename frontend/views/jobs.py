"""Pages about workloads: the tenant's list, launching one, one workload's page with its actions, the
queue (why work waits, where it runs) and operators' allocation view.

Every write goes through `jobs.services`, which checks the role again: the
pages only decide which actions to offer. A stale page that asks for an
action the workload's state no longer allows gets the service's refusal on
the page (409), not an error page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from common.errors import Conflict
from frontend import forms, live_paths, selectors
from frontend.access import Page, operator_view, tenant_view
from frontend.views import again, message_of
from jobs import selectors as job_selectors
from jobs import services
from jobs.choices import TERMINAL_STATES, ReasonCode, WorkloadKind, WorkloadState
from jobs.models import Workload
from jobs.selectors.progress import STEP_STATES
from jobs.services.actions import STARTED_STATES
from jobs.services.available import available_actions
from jobs.services.hibernation import notebook_link
from tenants import selectors as tenant_selectors
from tenants.choices import Role

WORKLOADS_PER_PAGE = 50
# How many of a workload's last output lines its page shows; the rest is in the download.
LOG_TAIL_LINES = 200


@tenant_view(Role.VIEWER)
def queue(request: HttpRequest, page: Page) -> HttpResponse:
    """Waiting work with its reason, position, hint and start estimate; the GPUs reserved for it; active work with
    its GPUs; each project's use per pool; recent preemptions with their cost."""
    waiting, active = selectors.queue_in_scope()
    context = {
        "page": page,
        "waiting": waiting,
        "reservations": selectors.reserved_among(waiting),
        "active": active,
        "use": job_selectors.project_use_in_scope(),
        "preemptions": selectors.recent_preemptions_in_scope(),
        "events_path": live_paths.tenant_events(page.tenant.slug),
        "state_labels": dict(WorkloadState.choices),
        "reason_labels": dict(ReasonCode.choices),
    }
    return render(request, "frontend/queue.html", context)


@operator_view
def ops_allocation(request: HttpRequest) -> HttpResponse:
    """Every tenant's GPUs in use per pool against its guarantee and limit."""
    return render(request, "frontend/ops_allocation.html", {"rows": job_selectors.allocation_by_pool_and_tenant()})


def _viewer_id(page: Page) -> int | None:
    return page.actor.user.pk if page.actor.user is not None else None


def notebook_url(page: Page, workload: Workload) -> str | None:
    """Return the console's hand-off path to `workload`'s Jupyter, or None when not running or not the viewer's to open.

    Asks the rule the proxy asks (`is_notebook_opener`), so nobody it turns away is offered the link.
    """
    return notebook_link(workload, viewer_id=_viewer_id(page), role=page.role)


def _project_choices() -> list[tuple[str, str]]:
    return [(p.slug, p.name) for p in tenant_selectors.projects_in_scope()]


@tenant_view(Role.VIEWER)
def workloads(request: HttpRequest, page: Page) -> HttpResponse:
    """The tenant's workloads, newest first, filtered by state, project, kind and "only mine"."""
    filters = forms.WorkloadFilterForm(request.GET, project_choices=_project_choices())
    chosen = filters.filters()
    owner = page.actor.user if chosen.pop("mine", False) else None
    listed = Paginator(selectors.workloads_matching(owner=owner, **chosen), WORKLOADS_PER_PAGE)
    items = listed.get_page(request.GET.get("page"))
    rows = [(w, notebook_url(page, w)) for w in items]
    context = {
        "page": page,
        "filters": filters,
        "items": items,
        "rows": rows,
        "events_path": live_paths.tenant_events(page.tenant.slug, chosen.get("project", "")),
        "state_labels": dict(WorkloadState.choices),
        "reason_labels": dict(ReasonCode.choices),
    }
    return render(request, "frontend/workloads.html", context)


@dataclass(frozen=True)
class WorkloadAction:
    """A button on a workload's page: the service it calls and what the page says of it. Which buttons a
    viewer gets is `jobs.services.available.available_actions`'s answer (`offered_actions`)."""

    name: str
    label: str
    help: str
    service: Callable[..., Workload]
    done: str
    danger: bool = False


WORKLOAD_ACTIONS = {
    action.name: action
    for action in (
        WorkloadAction(
            "cancel",
            "Cancel",
            "Take it out of the queue; its GPUs, if any were set aside, are freed.",
            services.cancel_workload,
            "cancelled",
            danger=True,
        ),
        WorkloadAction(
            "hibernate",
            "Hibernate",
            "Stop the notebook and free its GPUs; its files stay in your home, and Resume brings it back.",
            services.hibernate_notebook,
            "hibernated",
        ),
        WorkloadAction(
            "resume",
            "Resume",
            "Queue the notebook again with the same settings; it opens where you left it, with your files.",
            services.resume_notebook,
            "queued again",
        ),
        WorkloadAction(
            "stop",
            "Stop",
            "Stop its replicas (its stop signal, then SIGKILL after the pool's grace period) and free its GPUs.",
            services.cancel_workload,
            "stopped",
            danger=True,
        ),
        WorkloadAction(
            "restart",
            "Restart",
            "Queue it again as a new attempt with the same settings.",
            services.restart_workload,
            "queued again",
        ),
        WorkloadAction(
            "extend",
            "Keep it running",
            "It was warned as idle: keep it for another idle period (once per session).",
            services.extend_notebook,
            "extended",
        ),
    )
}


def _button(action: str, workload: Workload) -> str:
    """Return the page's button for an available action: cancelling work that has started is its Stop button."""
    return "stop" if action == "cancel" and workload.state in STARTED_STATES else action


def offered_actions(page: Page, workload: Workload) -> list[WorkloadAction]:
    """Return the buttons for the actions the viewer may take on `workload` now (`open` is the notebook link)."""
    viewer = page.actor.user.pk if page.actor.user is not None else None
    allowed = {_button(name, workload) for name in available_actions(workload, role=page.role, viewer_id=viewer)}
    return [action for action in WORKLOAD_ACTIONS.values() if action.name in allowed]


@tenant_view(Role.VIEWER)
def workload(request: HttpRequest, page: Page, pk: int) -> HttpResponse:
    """One workload: state, launch steps, timeline, where it runs, why it waits, its log tail; actions as POST `action`.

    `?part=live` answers only the parts its page's script swaps in when the workload changes.
    """
    found = selectors.workload_in_scope(pk)
    if found is None:
        raise Http404("No such workload.")
    if request.method != "POST":
        if request.GET.get("part") == "live":
            return render(request, "frontend/_workload_live.html", _workload_context(page, found))
        return _workload_page(request, page, found)
    action = WORKLOAD_ACTIONS.get(request.POST.get("action", ""))
    if action is None:
        return _workload_page(request, page, found, refusal="Choose one of the page's actions.", status=400)
    try:
        action.service(actor=page.actor, workload=found)
    except Conflict as error:
        # Show the state that made the service refuse, not the one the stale page was drawn from.
        current = selectors.workload_in_scope(pk) or found
        return _workload_page(request, page, current, refusal=error.message, status=409)
    except ValidationError as error:  # a rule that applies again on restart (quota, counts, images)
        return _workload_page(request, page, found, refusal=message_of(error), status=400)
    except PermissionDenied as error:
        return _workload_page(request, page, found, refusal=str(error), status=403)
    messages.success(request, f"Workload {found.name} {action.done}.")
    return again(request)


def _workload_page(
    request: HttpRequest, page: Page, workload: Workload, *, refusal: str = "", status: int = 200
) -> HttpResponse:
    context = {
        **_workload_context(page, workload),
        # `log_seq` numbers the last stored line: 0 means no output yet, so nothing to read.
        "log": job_selectors.workload_log(workload, since=None, limit=LOG_TAIL_LINES).lines if workload.log_seq else [],
        "log_limit": LOG_TAIL_LINES,
        "refusal": refusal,
        "live": _live_views(page, workload),
        # Charts for the GPUs it holds or held when the page was drawn; its GPU table follows later changes.
        "chart_gpus": gpus_held(workload),
        "state_labels": dict(WorkloadState.choices),
    }
    return render(request, "frontend/workload.html", context, status=status)


def _workload_context(page: Page, workload: Workload) -> dict[str, Any]:
    """Return what the live parts of a workload's page show (`_workload_head.html`, `_workload_timeline.html`)."""
    replicas = job_selectors.replicas_of_current_attempt(workload)
    due = job_selectors.capacity_due(workload.pool_id, now=timezone.now()) if workload.state == "pending" else None
    return {
        "page": page,
        "w": workload,
        "ended": workload.state in TERMINAL_STATES,
        "actions": offered_actions(page, workload),
        "replicas": replicas,
        "steps": job_selectors.launch_steps(workload, replicas, due=due),
        "simulated": job_selectors.ran_on_simulated_node(workload, replicas),
        "notebook_url": notebook_url(page, workload),
        # A notebook on its way up: its owner sees the Open JupyterLab button, inactive until Jupyter answers.
        "lab_soon": workload.kind == WorkloadKind.NOTEBOOK
        and workload.state in STEP_STATES
        and job_selectors.is_notebook_opener(workload, user_id=_viewer_id(page), role=page.role),
    }


def _live_views(page: Page, workload: Workload) -> dict[str, Any]:
    return {
        "events": live_paths.tenant_events(page.tenant.slug, workload.project.slug),
        "logs": live_paths.workload_logs(workload.pk),
        "metrics": live_paths.workload_metrics(workload.pk),
        "log_tail": live_paths.LOG_TAIL,
        "log_cap": live_paths.LOG_CAP,
    }


def gpus_held(workload: Workload) -> list[dict[str, Any]]:
    """Return the GPUs `workload` holds or held, one {uuid, index, node, model} each, from its loaded allocations."""
    held: dict[str, dict[str, Any]] = {}
    for a in workload.allocations.all():
        if a.gpu is not None:
            held[a.gpu.uuid] = {"uuid": a.gpu.uuid, "index": a.gpu.index, "node": a.node.name, "model": a.gpu.model}
    return list(held.values())
