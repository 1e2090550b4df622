"""The budgets and requests pages, and what the launch page says about the budgets a job answers to.

Budgets: everyone in the tenant sees each budget's use in its period as a
bar; tenant admins add, change and remove their projects' budgets, operators
the tenant's own. Requests: members ask for more for their projects (admins
for the tenant too); tenant admins decide on projects' requests, operators on
the tenant's own; a requester withdraws a pending one. Every write goes
through `accounting.services.budgets` and `accounting.services.increases`, as the API's do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.forms import Form
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounting import selectors
from accounting.choices import RequestState
from accounting.models import IncreaseRequest
from accounting.selectors.budget_notes import launch_notes, most_gpu_seconds
from accounting.selectors.budgets import BudgetState, budgets_in_scope, tenant_budget_states
from accounting.services import budgets, increases
from frontend.access import Page, operator_view, tenant_view
from frontend.forms.budgets import TENANT_ITSELF, AskForm, BudgetForm, BudgetNumbersForm, DecisionForm
from frontend.views import again, attempt
from inventory.selectors import pools_open_to_tenant
from tenants import selectors as tenant_selectors
from tenants.choices import Role
from tenants.models import Project

_NUMBERS = list(BudgetNumbersForm.base_fields)


def _projects(page: Page, *, itself: bool) -> list[tuple[str, str]]:
    """Return project choices: every project for admins, the viewer's own for members; the tenant first when
    `itself` (for whoever may act for the tenant as a whole)."""
    if page.is_admin:
        found = list(tenant_selectors.projects_in_scope())
    else:
        user = page.actor.user
        found = list(tenant_selectors.projects_of_member(user)) if user is not None else []
    choices = [(p.slug, p.name) for p in found]
    return [(TENANT_ITSELF, f"{page.tenant.name} (the tenant itself)"), *choices] if itself else choices


def _project(slug: str) -> Project | None:
    if slug == TENANT_ITSELF:
        return None
    return get_object_or_404(tenant_selectors.projects_in_scope(), slug=slug)


def _may_set(page: Page, state: BudgetState) -> bool:
    return page.is_operator if state.budget.project is None else page.is_admin


# --- budgets -------------------------------------------------------------------------------------------------


@tenant_view(Role.VIEWER)
def budgets_page(request: HttpRequest, page: Page) -> HttpResponse:
    """The tenant's budgets with their use; admins (and operators, for the tenant's own) add one here."""
    posted = request.method == "POST" and request.POST.get("action") == "budget"
    if posted and not page.is_admin:
        raise PermissionDenied("Tenant admins set budgets.")
    form = BudgetForm(request.POST if posted else None, project_choices=_projects(page, itself=page.is_operator))
    if posted and form.is_valid() and attempt(form, lambda: _create(page, form)):
        messages.success(request, "Budget saved.")
        return again(request)
    return render(request, "frontend/budgets.html", _budgets_context(page, form))


def _create(page: Page, form: BudgetForm) -> Any:
    data = dict(form.cleaned_data)
    project = _project(data.pop("project"))
    return budgets.create_budget(actor=page.actor, tenant=page.tenant, project=project, **data)


def _budgets_context(page: Page, form: Form, edited: dict[int, Form] | None = None) -> dict[str, Any]:
    rows = []
    for state in tenant_budget_states(page.tenant, now=timezone.now()):
        initial = {name: getattr(state.budget, name) for name in _NUMBERS}
        edit = (edited or {}).get(state.budget.pk) or BudgetNumbersForm(initial=initial, prefix=f"b{state.budget.pk}")
        rows.append((state, edit, _may_set(page, state)))
    return {"page": page, "rows": rows, "form": form}


@require_POST
@tenant_view(Role.ADMIN)
def budget_edit(request: HttpRequest, page: Page, pk: int) -> HttpResponse:
    """Change (`action=save`) or remove (`action=delete`) one budget; an error re-renders the page on its row."""
    budget = get_object_or_404(budgets_in_scope(), pk=pk)
    if request.POST.get("action") == "delete":
        budgets.delete_budget(actor=page.actor, budget=budget)
        messages.success(request, "Budget removed.")
        return _back(page, "frontend:budgets")
    form = BudgetNumbersForm(request.POST, prefix=f"b{pk}")
    update = lambda: budgets.update_budget(actor=page.actor, budget=budget, changes=form.cleaned_data)  # noqa: E731
    if form.is_valid() and attempt(form, update):
        messages.success(request, "Budget saved.")
        return _back(page, "frontend:budgets")
    new = BudgetForm(project_choices=_projects(page, itself=page.is_operator))
    return render(request, "frontend/budgets.html", _budgets_context(page, new, {pk: form}), status=400)


def _back(page: Page, name: str) -> HttpResponse:
    """Redirect to a page of the tenant (post/redirect/get)."""
    return redirect(name, tenant=page.tenant.slug)


# --- requests ------------------------------------------------------------------------------------------------


@tenant_view(Role.VIEWER)
def requests_page(request: HttpRequest, page: Page) -> HttpResponse:
    """Requests for more: members ask here; deciders approve or refuse pending ones; requesters withdraw theirs."""
    posted = request.method == "POST" and request.POST.get("action") == "ask"
    if posted and not page.can_write:
        raise PermissionDenied("Members ask for more.")
    form = AskForm(
        request.POST if posted else None,
        project_choices=_projects(page, itself=page.is_admin),
        pool_choices=[(p.name, p.name) for p in pools_open_to_tenant(page.tenant.pk)],
    )
    if posted and form.is_valid() and attempt(form, lambda: _ask(page, form)):
        messages.success(request, "Request sent.")
        return again(request)
    return render(request, "frontend/requests.html", _requests_context(page, form))


def _ask(page: Page, form: AskForm) -> IncreaseRequest:
    data = dict(form.cleaned_data)
    project = _project(data.pop("project"))
    ask = increases.ask_from(data)
    return increases.ask_for_more(actor=page.actor, tenant=page.tenant, project=project, ask=ask, now=timezone.now())


def _requests_context(page: Page, form: Form) -> dict[str, Any]:
    found = list(selectors.requests_in_scope()[:200])
    user_id = page.actor.user.pk if page.actor.user is not None else None
    # Who decides, as `accounting.services.increases.require_decider` says, from the role the page already read.
    rows = [
        (r, page.is_operator if r.project_id is None else page.is_admin, r.requester_id == user_id)
        for r in sorted(found, key=lambda r: r.state != RequestState.PENDING)
    ]
    return {"page": page, "rows": rows, "form": form, "decision": DecisionForm()}


_VERBS = {"approve": increases.approve_request, "refuse": increases.refuse_request}


@require_POST
@tenant_view(Role.MEMBER)
def request_decide(request: HttpRequest, page: Page, pk: int, verb: str) -> HttpResponse:
    """Approve, refuse (with a note) or cancel one request; the service decides who may."""
    found = get_object_or_404(selectors.requests_in_scope(), pk=pk)
    form = DecisionForm(request.POST)
    note = form.cleaned_data["note"] if form.is_valid() else ""
    if verb == "cancel":
        done = attempt(form, lambda: increases.cancel_request(actor=page.actor, request=found, now=timezone.now()))
    elif verb in _VERBS:
        decide = _VERBS[verb]
        done = attempt(form, lambda: decide(actor=page.actor, request=found, now=timezone.now(), note=note))
    else:
        raise Http404("No such action.")
    if done:
        messages.success(request, f"Request {done.state}.")
    else:
        for error in form.non_field_errors() or ["That could not be done."]:
            messages.error(request, str(error))
    return _back(page, "frontend:requests")


@operator_view
def ops_requests(request: HttpRequest) -> HttpResponse:
    """Every tenant's pending requests for the tenant itself, which operators decide: each links to its tenant's
    requests page, where the decision is made (as `request_decide` there). Operators only."""
    found = list(selectors.requests_awaiting_operators()[:500])
    return render(request, "frontend/ops_requests.html", {"requests": found})


# --- the launch page -----------------------------------------------------------------------------------------


def launch_notes_for_form(form: Form, projects: Sequence[Project]) -> list[str]:
    """Return the budget notes (`accounting.selectors.budget_notes`) for the job the launch form describes now
    (its data, else its initial values): its project (the first one offered when none is chosen), GPUs and
    maximum runtime."""
    slug = form["project"].value()
    project = next((p for p in projects if p.slug == slug), projects[0] if projects else None)
    gpus = _number(form["gpus_per_replica"].value(), 1) * _number(form["replicas"].value(), 1)
    runtime = _number(form["max_runtime_seconds"].value(), 0) or None
    return launch_notes(project, most_gpu_seconds([(gpus, runtime)]), now=timezone.now())


def _number(value: Any, default: int) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return default
