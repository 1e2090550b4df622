"""Pages of the console: thin adapters over the apps' services and selectors.

Every write goes through a service (which checks the role again, validates,
and writes one audit event); its errors are shown on the form that caused
them. Tenant pages get a `Page` from `tenant_view`; operator pages are 404
for everyone else. The inventory's operator pages (pools, nodes, GPUs) are
in `frontend.views.inventory`; members and invitations in `.members`,
quotas in `.quotas`, the audit log in `.audit`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.core.exceptions import ValidationError
from django.forms import Form
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from common.errors import Conflict
from frontend import forms
from frontend.access import Page, actor_of, operator_view, tenant_view
from frontend.selectors import (
    capacity_for_tenant,
    operator_start,
    tenants_for_switcher,
    tenants_with_counts,
    tokens_in_scope_of_user,
)
from inventory import selectors as pool_selectors
from jobs import selectors as job_selectors
from tenants import selectors, services
from tenants.choices import Role
from tenants.models import ApiToken, Tenant


def attempt(form: Form, call: Callable[[], Any]) -> Any | None:
    """Run a service call for a valid form; on a rule violation put the error on the form and return None."""
    try:
        return call()
    except (ValidationError, Conflict) as error:
        forms.apply_service_errors(form, error)
        return None


def again(request: HttpRequest) -> HttpResponseRedirect:
    """Redirect to the same page (post/redirect/get); htmx follows it and swaps in the fresh section."""
    return HttpResponseRedirect(request.get_full_path())


class LoginView(auth_views.LoginView):
    """The login page; `?username=` fills in the user name (an invitation link sends it with `next`)."""

    template_name = "frontend/login.html"
    authentication_form = forms.LoginForm
    redirect_authenticated_user = True

    def get_initial(self) -> dict[str, Any]:
        return {"username": self.request.GET.get("username", "")[:150]}


def home(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return redirect("frontend:login")
    actor = actor_of(request)
    tenants = tenants_for_switcher(actor)
    # Invitations addressed to them wait here (answering one takes its link: tenants/services/invitations.py).
    invitations = list(selectors.open_invitations_of_user(request.user))
    if len(tenants) == 1 and not actor.is_operator and not invitations:
        return redirect("frontend:overview", tenant=tenants[0].slug)
    tenant_form = forms.TenantForm() if actor.is_operator else None
    # Operators get a start page (next steps, the fleet at a glance) whether or not they are members anywhere.
    start = operator_start() if actor.is_operator else None
    context = {"tenants": tenants, "tenant_form": tenant_form, "start": start, "invitations": invitations}
    return render(request, "frontend/home.html", context)


@tenant_view(Role.VIEWER)
def overview(request: HttpRequest, page: Page) -> HttpResponse:
    context = {
        "page": page,
        "projects": selectors.projects_in_scope().count(),
        "members": selectors.memberships_in_scope().count(),
        "quotas": selectors.tenant_quotas_in_scope(),
        "capacity": capacity_for_tenant(pool_selectors.pools_visible_to(page.actor), page.tenant),
        # The idle warning and Resume reach their owner where they land, not only on the notebook's page.
        "awaiting": _awaiting(page),
    }
    return render(request, "frontend/overview.html", context)


def _awaiting(page: Page) -> list[Any]:
    """Return the viewer's notebooks that ask something of them (warned as idle, hibernated); none for viewers."""
    user = page.actor.user
    if user is None or not page.can_write:
        return []
    return list(job_selectors.notebooks_awaiting_owner(user)[:50])


@tenant_view(Role.VIEWER)
def projects(request: HttpRequest, page: Page) -> HttpResponse:
    form = forms.ProjectForm(request.POST if request.method == "POST" else None, prefix="new")
    if form.is_valid() and attempt(
        form, lambda: services.create_project(actor=page.actor, tenant=page.tenant, **form.cleaned_data)
    ):
        messages.success(request, f"Project {form.cleaned_data['slug']} created.")
        return again(request)
    context = {"page": page, "projects": selectors.projects_in_scope(), "form": form}
    return render(request, "frontend/projects.html", context)


@tenant_view(Role.ADMIN)
def project_edit(request: HttpRequest, page: Page, slug: str) -> HttpResponse:
    project = get_object_or_404(selectors.projects_in_scope(), slug=slug)
    if request.method == "POST" and "delete" in request.POST:
        services.delete_project(actor=page.actor, project=project)
        messages.success(request, f"Project {slug} deleted.")
        return redirect("frontend:projects", tenant=page.tenant.slug)
    form = forms.ProjectEditForm(request.POST if request.method == "POST" else None, initial=vars(project))
    if form.is_valid() and attempt(
        form, lambda: services.update_project(actor=page.actor, project=project, **form.cleaned_data)
    ):
        messages.success(request, f"Project {slug} saved.")
        return redirect("frontend:projects", tenant=page.tenant.slug)
    return render(request, "frontend/project_edit.html", {"page": page, "project": project, "form": form})


def message_of(error: ValidationError | Conflict) -> str:
    """Return a service error as one sentence for a flash message."""
    return error.message if isinstance(error, Conflict) else " ".join(error.messages)


def _role_choices(page: Page) -> list[tuple[str, str]]:
    roles = [Role.VIEWER, Role.MEMBER, Role.ADMIN]
    return [(r.value, r.label) for r in roles if page.role.at_least(r)]


@tenant_view(Role.VIEWER)
def tokens(request: HttpRequest, page: Page) -> HttpResponse:
    # A new token starts at the owner's own role: a member's first token can launch (issue 17).
    own = services.default_token_role(page.actor, page.tenant)
    form = forms.TokenForm(
        request.POST if request.method == "POST" else None, role_choices=_role_choices(page), initial={"role": own}
    )
    issued = form.is_valid() and attempt(
        form, lambda: services.create_token(actor=page.actor, tenant=page.tenant, **form.cleaned_data)
    )
    if issued:
        request.session["token_secret"] = issued.secret
        return again(request)
    context = {
        "page": page,
        "form": form,
        "secret": request.session.pop("token_secret", None),
        "mine": tokens_in_scope_of_user(page.actor),
        "everyone": ApiToken.objects.select_related("user") if page.is_admin else None,
        "now": timezone.now(),
    }
    return render(request, "frontend/tokens.html", context)


@require_POST
@tenant_view(Role.VIEWER)
def token_revoke(request: HttpRequest, page: Page, pk: int) -> HttpResponse:
    token = get_object_or_404(ApiToken.objects.all(), pk=pk)
    services.revoke_token(actor=page.actor, token=token)
    messages.success(request, f"Token {token.name} revoked.")
    return redirect("frontend:tokens", tenant=page.tenant.slug)


@operator_view
def ops_tenants(request: HttpRequest) -> HttpResponse:
    form = forms.TenantForm(request.POST if request.method == "POST" and "create" in request.POST else None)
    if form.is_valid() and attempt(form, lambda: services.create_tenant(actor=actor_of(request), **form.cleaned_data)):
        messages.success(request, f"Tenant {form.cleaned_data['slug']} created.")
        return again(request)
    if request.method == "POST" and "toggle" in request.POST:
        tenant = get_object_or_404(Tenant, slug=request.POST["toggle"])
        services.update_tenant(actor=actor_of(request), tenant=tenant, is_active=not tenant.is_active)
        return again(request)
    return render(request, "frontend/ops_tenants.html", {"tenants": tenants_with_counts(), "form": form})
