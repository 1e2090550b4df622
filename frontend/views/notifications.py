"""Notification pages: each person's e-mail choices in a tenant, and the webhook endpoints with their delivery log
(a tenant's, for its admins; the platform's, with the operator's own node-health e-mail, for operators).

Thin adapters: the rules (URLs webhooks may reach, event kinds, who may)
are `notifications.services`' and their errors land on the form's fields.
A new endpoint's secret, or a rotated one, is shown once, after the redirect.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from frontend.access import Page, actor_of, operator_view, tenant_view
from frontend.views import again, attempt
from notifications import selectors, services
from notifications.models import WebhookEndpoint
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Tenant

SECRET_KEY = "webhook_secret"  # noqa: S105 -- the session key the one-time secret waits under, not a secret
RECENT = 50


class EmailChoicesForm(forms.Form):
    """One checkbox per event kind: checked means e-mail."""

    def __init__(self, *args: Any, choices: list[selectors.EmailChoice], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for choice in choices:
            help_text = "On unless you turn it off." if choice.default else "Off unless you turn it on."
            self.fields[choice.kind] = forms.BooleanField(
                required=False, initial=choice.email, label=choice.label, help_text=help_text
            )


class WebhookForm(forms.Form):
    """A new endpoint; the rules are the service's."""

    url = forms.CharField(
        max_length=2000, label="URL", widget=forms.URLInput(attrs={"placeholder": "https://hooks.example.com/gpucloud"})
    )
    description = forms.CharField(max_length=200, required=False)
    # Not required here: the service names a missing choice beside the URL's problems, all at once.
    kinds = forms.MultipleChoiceField(label="Events", required=False, widget=forms.CheckboxSelectMultiple)

    def __init__(self, *args: Any, tenant_id: int | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["kinds"]
        assert isinstance(field, forms.MultipleChoiceField)
        field.choices = [(kind.value, kind.label) for kind in selectors.kinds_for(tenant_id)]


def _choices_form(request: HttpRequest, actor: Actor, tenant: Tenant | None, prefix: str) -> EmailChoicesForm | None:
    """Return the e-mail choices form, or None once a valid post was saved (the caller redirects)."""
    assert actor.user is not None
    posted = request.POST if request.method == "POST" and f"{prefix}-save" in request.POST else None
    choices = selectors.email_choices(actor.user, tenant.pk if tenant is not None else None)
    form = EmailChoicesForm(posted, choices=choices, prefix=prefix)
    if form.is_valid() and attempt(
        form, lambda: services.set_email_choices(actor=actor, tenant=tenant, choices=form.cleaned_data)
    ):
        messages.success(request, "Your e-mail choices are saved.")
        return None
    return form


@tenant_view(Role.VIEWER)
def notification_settings(request: HttpRequest, page: Page) -> HttpResponse:
    user = page.actor.user
    assert user is not None
    form = _choices_form(request, page.actor, page.tenant, "mail")
    if form is None:
        return again(request)
    context = {
        "page": page,
        "form": form,
        "email_on": settings.NOTIFICATIONS_EMAIL,
        "address": user.email,
        "emails": selectors.emails_to(user, page.tenant.pk)[:RECENT],
    }
    return render(request, "frontend/notification_settings.html", context)


def _webhooks_page(request: HttpRequest, actor: Actor, tenant: Tenant | None, extra: dict[str, Any]) -> HttpResponse:
    """The endpoints of `tenant` (of the platform for None), the form to add one, and their recent deliveries."""
    tenant_id = tenant.pk if tenant is not None else None
    form = WebhookForm(request.POST if "add" in request.POST else None, tenant_id=tenant_id, prefix="hook")
    issued = form.is_valid() and attempt(
        form, lambda: services.create_webhook(actor=actor, tenant=tenant, **form.cleaned_data)
    )
    if issued:
        request.session[SECRET_KEY] = issued.secret
        messages.success(request, f"Webhook {issued.endpoint.url} added.")
        return again(request)
    endpoints = selectors.endpoints_in_scope() if tenant is not None else selectors.platform_endpoints()
    deliveries = (
        selectors.webhook_deliveries_in_scope() if tenant is not None else selectors.platform_webhook_deliveries()
    )
    context = {
        "form": form,
        "secret": request.session.pop(SECRET_KEY, None),
        "endpoints": endpoints,
        "deliveries": deliveries[:RECENT],
        "allow_private": settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE,
        **extra,
    }
    return render(request, "frontend/webhooks.html", context)


def _edit(request: HttpRequest, actor: Actor, endpoint: WebhookEndpoint) -> None:
    """Apply the posted action to `endpoint`: rotate its secret, turn it on or off, or remove it."""
    action = request.POST.get("action", "")
    if action == "rotate":
        request.session[SECRET_KEY] = services.rotate_webhook_secret(actor=actor, endpoint=endpoint).secret
        messages.success(request, f"{endpoint.url} has a new secret; the old one signs nothing from now on.")
    elif action == "toggle":
        changed = services.update_webhook(actor=actor, endpoint=endpoint, changes={"is_active": not endpoint.is_active})
        messages.success(request, f"{endpoint.url} turned {'on' if changed.is_active else 'off'}.")
    elif action == "remove":
        services.delete_webhook(actor=actor, endpoint=endpoint)
        messages.success(request, f"{endpoint.url} removed; its delivery log stays.")


@tenant_view(Role.ADMIN)
def webhooks(request: HttpRequest, page: Page) -> HttpResponse:
    return _webhooks_page(request, page.actor, page.tenant, {"page": page})


@require_POST
@tenant_view(Role.ADMIN)
def webhook_edit(request: HttpRequest, page: Page, pk: int) -> HttpResponseRedirect:
    _edit(request, page.actor, get_object_or_404(selectors.endpoints_in_scope(), pk=pk))
    return redirect("frontend:webhooks", tenant=page.tenant.slug)


@operator_view
def ops_webhooks(request: HttpRequest) -> HttpResponse:
    actor = actor_of(request)
    choices = _choices_form(request, actor, None, "mail")
    if choices is None:
        return again(request)
    return _webhooks_page(request, actor, None, {"choices": choices, "email_on": settings.NOTIFICATIONS_EMAIL})


@require_POST
@operator_view
def ops_webhook_edit(request: HttpRequest, pk: int) -> HttpResponseRedirect:
    _edit(request, actor_of(request), get_object_or_404(selectors.platform_endpoints(), pk=pk))
    return redirect("frontend:ops_webhooks")
