"""Pages of the console: thin adapters over the apps' services and selectors.

Every write goes through a service (which checks the role again, validates,
and writes one audit event); its errors are shown on the form that caused
them. Tenant pages get a `Page` from `tenant_view`; operator pages are 404
for everyone else. The inventory's operator pages (pools, nodes, GPUs) are
in `frontend.views.inventory`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.forms import Form
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse_lazy
from django.utils import timezone
from django.views.decorators.http import require_POST

from common.errors import Conflict
from frontend import forms
from frontend.access import Page, actor_of, operator_view, tenant_view
from frontend.selectors import (
    capacity_for_tenant,
    tenants_for_switcher,
    tenants_with_counts,
    tokens_in_scope_of_user,
)
from inventory import selectors as pool_selectors
from tenants import selectors, services
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import ApiToken, Membership, ProjectQuota, Tenant, TenantQuota


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
    template_name = "frontend/login.html"
    authentication_form = forms.LoginForm
    redirect_authenticated_user = True


class AcceptInviteView(auth_views.PasswordResetConfirmView):
    """Where an invited person chooses a password, through the one-time link an admin passed on."""

    template_name = "frontend/accept_invite.html"
    success_url = reverse_lazy("frontend:login")
    reset_url_token = "set-password"  # noqa: S105 -- a URL segment, not a secret

    def form_valid(self, form: Any) -> HttpResponse:
        # The password is saved by the service (validated, audited), not by the form.
        services.set_password(actor=Actor(user=form.user), user=form.user, password=form.cleaned_data["new_password1"])
        del self.request.session[auth_views.INTERNAL_RESET_SESSION_TOKEN]
        messages.success(self.request, "Your password is set. Log in to continue.")
        return HttpResponseRedirect(self.get_success_url())


def home(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return redirect("frontend:login")
    actor = actor_of(request)
    tenants = tenants_for_switcher(actor)
    if len(tenants) == 1 and not actor.is_operator:
        return redirect("frontend:overview", tenant=tenants[0].slug)
    tenant_form = forms.TenantForm() if actor.is_operator else None
    return render(request, "frontend/home.html", {"tenants": tenants, "tenant_form": tenant_form})


@tenant_view(Role.VIEWER)
def overview(request: HttpRequest, page: Page) -> HttpResponse:
    context = {
        "page": page,
        "projects": selectors.projects_in_scope().count(),
        "members": selectors.memberships_in_scope().count(),
        "quotas": selectors.tenant_quotas_in_scope(),
        "capacity": capacity_for_tenant(pool_selectors.pools_visible_to(page.actor), page.tenant),
    }
    return render(request, "frontend/overview.html", context)


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


def _project_choices() -> list[tuple[str, str]]:
    return [(p.slug, p.name) for p in selectors.projects_in_scope()]


@tenant_view(Role.VIEWER)
def members(request: HttpRequest, page: Page) -> HttpResponse:
    form = forms.InviteForm(request.POST if request.method == "POST" else None, prefix="invite")
    invitation = form.is_valid() and attempt(
        form, lambda: services.invite_member(actor=page.actor, tenant=page.tenant, **form.cleaned_data)
    )
    if invitation:
        messages.success(request, f"{invitation.membership.user.username} is now a member.")
        if invitation.setup_path:
            request.session["invite_link"] = request.build_absolute_uri(invitation.setup_path)
        return again(request)
    rows = [
        (
            m,
            forms.MemberForm(
                initial={"role": m.role, "projects": [p.slug for p in m.projects.all()]},
                project_choices=_project_choices(),
                prefix=f"m{m.pk}",
            ),
        )
        for m in selectors.memberships_in_scope()
    ]
    context = {"page": page, "rows": rows, "form": form, "invite_link": request.session.pop("invite_link", None)}
    return render(request, "frontend/members.html", context)


def message_of(error: ValidationError | Conflict) -> str:
    """Return a service error as one sentence for a flash message."""
    return error.message if isinstance(error, Conflict) else " ".join(error.messages)


@require_POST
@tenant_view(Role.ADMIN)
def member_edit(request: HttpRequest, page: Page, pk: int) -> HttpResponse:
    membership = get_object_or_404(selectors.memberships_in_scope(), pk=pk)
    try:
        _change_member(request, page, membership)
        messages.success(request, f"{membership.user.username} updated.")
    except (ValidationError, Conflict) as error:
        messages.error(request, message_of(error))
    return redirect("frontend:members", tenant=page.tenant.slug)


def _change_member(request: HttpRequest, page: Page, membership: Membership) -> None:
    if "remove" in request.POST:
        services.remove_member(actor=page.actor, membership=membership)
        return
    form = forms.MemberForm(request.POST, project_choices=_project_choices(), prefix=f"m{membership.pk}")
    if not form.is_valid():
        raise ValidationError("Choose a valid role and projects.")
    chosen = list(selectors.projects_in_scope().filter(slug__in=form.cleaned_data["projects"]))
    services.update_member(actor=page.actor, membership=membership, role=form.cleaned_data["role"], projects=chosen)


def _pool_choices(page: Page) -> list[tuple[str, str]]:
    return [(p.name, p.name) for p in pool_selectors.pools_open_to_tenant(page.tenant.pk)]


def _quota_values(data: dict[str, Any]) -> services.QuotaValues:
    return services.QuotaValues().merged(data)


@tenant_view(Role.VIEWER)
def quotas(request: HttpRequest, page: Page) -> HttpResponse:
    """The tenant's quotas per pool (operators edit) and their split across projects (admins edit)."""
    action = request.POST.get("action", "") if request.method == "POST" else ""
    tenant_form, project_form = _new_quota_forms(page, request.POST if action else None, action)
    create = {
        "tenant-quota": (tenant_form, _create_tenant_quota),
        "project-quota": (project_form, _create_project_quota),
    }
    if action in create:
        form, service = create[action]
        if form.is_valid() and attempt(form, lambda: service(page, form)):
            messages.success(request, "Quota saved.")
            return again(request)
    return render(request, "frontend/quotas.html", _quota_context(page, tenant_form, project_form))


def _new_quota_forms(page: Page, data: Any = None, action: str = "") -> tuple[Any, Any]:
    """Return the add-quota forms; only the one named by `action` is bound to `data`."""
    pools = _pool_choices(page)
    return (
        forms.TenantQuotaForm(data if action == "tenant-quota" else None, pool_choices=pools, prefix="tq"),
        forms.ProjectQuotaForm(
            data if action == "project-quota" else None,
            pool_choices=pools,
            project_choices=_project_choices(),
            prefix="pq",
        ),
    )


def _create_tenant_quota(page: Page, form: forms.TenantQuotaForm) -> TenantQuota:
    data = dict(form.cleaned_data)
    pool = get_object_or_404(pool_selectors.pools_open_to_tenant(page.tenant.pk), name=data.pop("pool"))
    return services.create_tenant_quota(actor=page.actor, tenant=page.tenant, pool=pool, values=_quota_values(data))


def _create_project_quota(page: Page, form: forms.ProjectQuotaForm) -> ProjectQuota:
    data = dict(form.cleaned_data)
    pool = get_object_or_404(pool_selectors.pools_open_to_tenant(page.tenant.pk), name=data.pop("pool"))
    project = get_object_or_404(selectors.projects_in_scope(), slug=data.pop("project"))
    return services.create_project_quota(actor=page.actor, project=project, pool=pool, values=_quota_values(data))


def _quota_context(
    page: Page, tenant_form: Form, project_form: Form, edited: dict[str, Form] | None = None
) -> dict[str, Any]:
    edited = edited or {}
    tenant_rows = [
        (q, edited.get(f"tq{q.pk}") or forms.QuotaNumbersForm(initial=vars(q), prefix=f"tq{q.pk}"))
        for q in selectors.tenant_quotas_in_scope()
    ]
    project_rows = [
        (q, edited.get(f"pq{q.pk}") or forms.QuotaNumbersForm(initial=vars(q), prefix=f"pq{q.pk}"))
        for q in selectors.project_quotas_in_scope()
    ]
    return {
        "page": page,
        "tenant_rows": tenant_rows,
        "project_rows": project_rows,
        "tenant_form": tenant_form,
        "project_form": project_form,
    }


# The two kinds of quota an edit URL names: where to find one, and the services that change and delete it.
QUOTA_KINDS: dict[str, tuple[Callable[[], Any], Callable[..., Any], Callable[..., Any]]] = {
    "tq": (selectors.tenant_quotas_in_scope, services.update_tenant_quota, services.delete_tenant_quota),
    "pq": (selectors.project_quotas_in_scope, services.update_project_quota, services.delete_project_quota),
}


@require_POST
@tenant_view(Role.ADMIN)
def quota_edit(request: HttpRequest, page: Page, kind: str, pk: int) -> HttpResponse:
    """Change or delete one quota; a rule violation re-renders the quotas page with the error on that row."""
    if kind not in QUOTA_KINDS:
        raise Http404("No such quota.")
    in_scope, update, delete = QUOTA_KINDS[kind]
    quota = get_object_or_404(in_scope(), pk=pk)
    prefix = f"{kind}{pk}"
    if "delete" in request.POST:
        delete(actor=page.actor, quota=quota)
        messages.success(request, "Quota removed.")
        return redirect("frontend:quotas", tenant=page.tenant.slug)
    form = forms.QuotaNumbersForm(request.POST, prefix=prefix)
    if form.is_valid() and attempt(form, lambda: update(actor=page.actor, quota=quota, changes=form.cleaned_data)):
        messages.success(request, "Quota saved.")
        return redirect("frontend:quotas", tenant=page.tenant.slug)
    tenant_form, project_form = _new_quota_forms(page)
    return render(request, "frontend/quotas.html", _quota_context(page, tenant_form, project_form, {prefix: form}))


def _role_choices(page: Page) -> list[tuple[str, str]]:
    roles = [Role.VIEWER, Role.MEMBER, Role.ADMIN]
    return [(r.value, r.label) for r in roles if page.role.at_least(r)]


@tenant_view(Role.VIEWER)
def tokens(request: HttpRequest, page: Page) -> HttpResponse:
    form = forms.TokenForm(request.POST if request.method == "POST" else None, role_choices=_role_choices(page))
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


@tenant_view(Role.ADMIN)
def audit(request: HttpRequest, page: Page) -> HttpResponse:
    events = selectors.audit_events_in_scope()
    prefix = request.GET.get("action", "").strip()
    if prefix:
        events = events.filter(action__startswith=prefix)
    paginator = Paginator(events, 50)
    return render(
        request,
        "frontend/audit.html",
        {"page": page, "events": paginator.get_page(request.GET.get("page")), "action": prefix},
    )


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
