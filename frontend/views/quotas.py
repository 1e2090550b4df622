"""The quotas page: a tenant's GPU quota per pool (operators edit) and its split across projects (admins edit).

Guarantees may oversubscribe what backs them (the pool's GPUs, the tenant's
guarantee); the page says where and by how much, beside the quota and after
saving, and leaves the choice to whoever sets them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.forms import Form
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from frontend import forms
from frontend.access import Page, tenant_view
from frontend.views import again, attempt
from inventory import selectors as pool_selectors
from tenants import selectors, services
from tenants.choices import Role
from tenants.models import ProjectQuota, TenantQuota
from tenants.selectors import Oversubscription


def _pool_choices(page: Page) -> list[tuple[str, str]]:
    return [(p.name, p.name) for p in pool_selectors.pools_open_to_tenant(page.tenant.pk)]


def _project_choices() -> list[tuple[str, str]]:
    return [(p.slug, p.name) for p in selectors.projects_in_scope()]


def oversubscription(page: Page) -> list[Oversubscription]:
    """Return where the tenant's guarantees exceed what backs them; all tenants' only for operators."""
    pool_ids = list(selectors.tenant_quotas_in_scope().values_list("pool_id", flat=True))
    capacity = pool_selectors.pool_capacity(pool_ids)
    gpus = {pool_id: sum(m["total"] for m in models) for pool_id, models in capacity.items()}
    return selectors.oversubscribed_guarantees(page.tenant, gpus, across_tenants=page.is_operator)


def _warn_after_saving(request: HttpRequest, page: Page, pool_id: int) -> None:
    for warning in oversubscription(page):
        if warning.pool_id == pool_id:
            messages.warning(request, warning.message)


def _numbers_initial(quota: TenantQuota | ProjectQuota) -> dict[str, Any]:
    """Return a quota's numbers as its edit form starts: no limit shows as an empty field."""
    initial = {name: getattr(quota, name) for name in forms.QuotaNumbersForm.base_fields}
    initial["limit"] = quota.limit if quota.has_limit else None
    return initial


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
        saved = form.is_valid() and attempt(form, lambda: service(page, form))
        if saved:
            messages.success(request, "Quota saved.")
            _warn_after_saving(request, page, saved.pool_id)
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
    values = services.QuotaValues().merged(data)
    return services.create_tenant_quota(actor=page.actor, tenant=page.tenant, pool=pool, values=values)


def _create_project_quota(page: Page, form: forms.ProjectQuotaForm) -> ProjectQuota:
    data = dict(form.cleaned_data)
    pool = get_object_or_404(pool_selectors.pools_open_to_tenant(page.tenant.pk), name=data.pop("pool"))
    project = get_object_or_404(selectors.projects_in_scope(), slug=data.pop("project"))
    values = services.QuotaValues().merged(data)
    return services.create_project_quota(actor=page.actor, project=project, pool=pool, values=values)


def _rows(quotas: Any, kind: str, edited: dict[str, Form], warnings: dict[int, list[str]]) -> list[Any]:
    """Return (quota, its edit form, its warnings) per quota: a form the last post refused keeps its errors."""
    return [
        (
            q,
            edited.get(f"{kind}{q.pk}") or forms.QuotaNumbersForm(initial=_numbers_initial(q), prefix=f"{kind}{q.pk}"),
            warnings.get(q.pool_id, []),
        )
        for q in quotas
    ]


def _quota_context(
    page: Page, tenant_form: Form, project_form: Form, edited: dict[str, Form] | None = None
) -> dict[str, Any]:
    found = oversubscription(page)
    by_scope: dict[str, dict[int, list[str]]] = {"pool": {}, "tenant": {}}
    for warning in found:
        by_scope[warning.scope].setdefault(warning.pool_id, []).append(warning.message)
    return {
        "page": page,
        "tenant_rows": _rows(selectors.tenant_quotas_in_scope(), "tq", edited or {}, by_scope["pool"]),
        "project_rows": _rows(selectors.project_quotas_in_scope(), "pq", edited or {}, by_scope["tenant"]),
        "split_warnings": [w.message for w in found if w.scope == "tenant"],
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
        _warn_after_saving(request, page, quota.pool_id)
        return redirect("frontend:quotas", tenant=page.tenant.slug)
    tenant_form, project_form = _new_quota_forms(page)
    return render(request, "frontend/quotas.html", _quota_context(page, tenant_form, project_form, {prefix: form}))
