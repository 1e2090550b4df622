"""Members and invitations: the members page, changing a member, and the page an invitation link opens.

An invitation names the tenant, the role and the projects the new member
joins; its link shows all of them with the user name. Nobody joins until
they answer it there (tenants/services/invitations.py says why).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.forms import SetPasswordForm
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.http import require_POST

from common.errors import Conflict
from frontend import forms
from frontend.access import Page, tenant_view
from frontend.views import again, attempt, message_of
from tenants import selectors, services
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Invitation, Membership

# The backend that signs in someone who has just made their account through an invitation link.
_MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


def invitation(request: HttpRequest, secret: str) -> HttpResponse:
    """The page an invitation link opens: the inviting tenant, the role and projects, and the answer.

    The same page for everyone who is not signed in, whether or not the
    user name is taken (the inviter, who has the link too, learns nothing
    by opening it): choose a password to create the account, or sign in as
    it and come back. Signed in as the invited account: accept or decline.
    A used, withdrawn, expired or made-up link names nothing.
    """
    found = services.open_invitation(secret)
    if found is None:
        return render(request, "frontend/invitation.html", {"gone": True}, status=410)
    signed_in = request.user if request.user.is_authenticated else None
    if signed_in is not None:
        return _answer(request, secret, found, signed_in)
    form = SetPasswordForm(User(username=found.username, email=found.email), request.POST or None)
    if request.method == "POST" and form.is_valid():
        password = form.cleaned_data["new_password1"]
        user = attempt(form, lambda: services.create_invited_account(secret=secret, password=password))
        if user is not None:
            login(request, user, backend=_MODEL_BACKEND)
            messages.success(request, f"Welcome, {user.get_username()}: you are signed in and a member.")
            return redirect("frontend:overview", tenant=found.tenant.slug)
    login_url = f"{reverse('frontend:login')}?{urlencode({'next': request.path, 'username': found.username})}"
    return render(request, "frontend/invitation.html", {"invitation": found, "form": form, "login_url": login_url})


def _answer(request: HttpRequest, secret: str, found: Invitation, user: Any) -> HttpResponse:
    """Accept or decline `found` as the signed-in `user` (a POST), or show the choice (a GET)."""
    if request.method == "POST":
        actor = Actor(user=user)
        try:
            if "decline" in request.POST:
                services.decline_invitation(actor=actor, secret=secret)
                messages.info(request, f"You declined the invitation to {found.tenant.name}.")
                return redirect("frontend:home")
            services.accept_invitation(actor=actor, secret=secret)
        except (Conflict, ValidationError) as error:
            messages.error(request, message_of(error))
            return redirect("frontend:home")
        except PermissionDenied as error:
            messages.error(request, str(error))
            return redirect("frontend:home")
        messages.success(request, f"You joined {found.tenant.name}.")
        return redirect("frontend:overview", tenant=found.tenant.slug)
    mine = user.get_username() == found.username
    return render(request, "frontend/invitation.html", {"invitation": found, "answer": mine, "signed_in": user})


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
        messages.success(request, f"{invitation.invitation.username} is invited: send them the link below.")
        request.session["invite_link"] = request.build_absolute_uri(invitation.link_path)
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
    context = {
        "page": page,
        "rows": rows,
        "form": form,
        "invited": selectors.pending_invitations_in_scope() if page.is_admin else [],
        "now": timezone.now(),
        "invite_link": request.session.pop("invite_link", None),
    }
    return render(request, "frontend/members.html", context)


@require_POST
@tenant_view(Role.ADMIN)
def invitation_withdraw(request: HttpRequest, page: Page, pk: int) -> HttpResponse:
    """Withdraw a pending invitation: its link stops working."""
    found = get_object_or_404(selectors.pending_invitations_in_scope(), pk=pk)
    services.withdraw_invitation(actor=page.actor, invitation=found)
    messages.success(request, f"The invitation of {found.username} is withdrawn.")
    return redirect("frontend:members", tenant=page.tenant.slug)


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
