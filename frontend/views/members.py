"""Members and invitations: the members page, changing a member, and the page an invitation link opens.

An invitation names the tenant, the role and the projects the new member
joins; its link shows all of them with the user name, and setting the
password signs the new member in and takes them to their tenant.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_POST

from common.errors import Conflict
from frontend import forms
from frontend.access import Page, tenant_view
from frontend.views import again, attempt, message_of
from tenants import selectors, services
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Membership

# The backend that signs in someone who has just proved who they are with an invitation link.
_MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


class AcceptInviteView(auth_views.PasswordResetConfirmView):
    """Where an invited person sees what they were invited to and chooses a password, through the
    one-time link an admin passed on; then they are signed in and on their tenant."""

    template_name = "frontend/accept_invite.html"
    reset_url_token = "set-password"  # noqa: S105 -- a URL segment, not a secret

    def dispatch(self, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = super().dispatch(*args, **kwargs)
        # A good link answers with a redirect to the set-password page; only a dead one renders at once.
        if self.validlink or isinstance(response, HttpResponseRedirect):
            return response
        return self._used_link() or response

    def _used_link(self) -> HttpResponse | None:
        """Answer a link that no longer works: their own tenant for its owner already signed in, the login
        page with their user name for one that carries it (see `services.invited_username`), else None."""
        user = self.request.user
        owner = self.get_user(self.kwargs["uidb64"])
        if user.is_authenticated and owner is not None and user.pk == owner.pk:
            return redirect("frontend:home")
        username = services.invited_username(self.request.GET.get("as", ""))
        if username is None:
            return None
        messages.info(self.request, f"This invitation was already used. Log in as {username} with your password.")
        return HttpResponseRedirect(f"{reverse('frontend:login')}?{urlencode({'username': username})}")

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        if context.get("validlink"):
            context["invited"] = self.user
            context["memberships"] = selectors.invitations_of_user(self.user)
        return context

    def form_valid(self, form: Any) -> HttpResponse:
        # The password is saved by the service (validated, audited), not by the form.
        user = form.user
        services.set_password(actor=Actor(user=user), user=user, password=form.cleaned_data["new_password1"])
        del self.request.session[auth_views.INTERNAL_RESET_SESSION_TOKEN]
        login(self.request, user, backend=_MODEL_BACKEND)
        messages.success(self.request, f"Welcome, {user.get_username()}: your password is set and you are signed in.")
        return redirect("frontend:home")


def _project_choices() -> list[tuple[str, str]]:
    return [(p.slug, p.name) for p in selectors.projects_in_scope()]


@tenant_view(Role.VIEWER)
def members(request: HttpRequest, page: Page) -> HttpResponse:
    """The tenant's members; admins invite (onto projects) and change them here."""
    data = request.POST if request.method == "POST" else None
    form = forms.InviteForm(data, project_choices=_project_choices(), prefix="invite")
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
