"""Members of a tenant: invitations, roles, project assignment, removal.

Role grants are bounded by the granter: only tenant admins (and operators)
manage members, nobody grants a role above their own, and operator rights
are never granted through a membership. A tenant keeps at least one admin
unless an operator decides otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import PermissionDenied
from django.core.validators import validate_email
from django.db import transaction
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from common.errors import Conflict, invalid
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Membership, Project, Tenant
from tenants.services.access import require_role
from tenants.services.audit import JsonDict, delete_audited, record_audit_event, update_audited

_USERNAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@.+-_")


@dataclass(frozen=True)
class Invitation:
    """A new membership and, when the account is new, the one-time path where its owner sets a password."""

    membership: Membership
    setup_path: str | None


def _membership_snapshot(membership: Membership) -> JsonDict:
    return {
        "user": membership.user.get_username(),
        "email": membership.email,
        "role": membership.role,
        "projects": sorted(p.slug for p in membership.projects.all()) if membership.pk else [],
    }


def _check_grantable(actor_role: Role, role: str) -> Role:
    if role not in {Role.VIEWER, Role.MEMBER, Role.ADMIN}:
        raise invalid("role", "invalid_choice", "Role must be one of viewer, member or admin.")
    granted = Role(role)
    if not actor_role.at_least(granted):
        raise PermissionDenied("You cannot grant a role above your own.")
    return granted


def _setup_path(user: User) -> str:
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    return reverse("frontend:accept_invite", kwargs={"uidb64": uid, "token": default_token_generator.make_token(user)})


def _checked_input(username: str, email: str) -> None:
    if not username or len(username) > 150 or not set(username) <= _USERNAME_CHARS:
        raise invalid("username", "invalid", "Use up to 150 letters, digits and @ . + - _ characters.")
    if email:
        try:
            validate_email(email)
        except Exception:
            raise invalid("email", "invalid", "Enter a valid email address.") from None


def _existing_or_new_user(username: str, email: str) -> tuple[User, bool]:
    """Return the account named `username` and False, or a new one (with `email`, no usable password) and True.

    An existing account is returned as it is: nothing of it (its own e-mail
    address, its name, its other tenants) goes back to the inviting tenant.
    """
    user = User.objects.filter(username=username).first()
    if user is not None:
        return user, False
    user = User(username=username, email=email)
    user.set_unusable_password()
    user.save()
    return user, True


@transaction.atomic
def invite_member(
    *, actor: Actor, tenant: Tenant, username: str, email: str = "", role: str = Role.MEMBER
) -> Invitation:
    """Make `username` a member of `tenant` with `role`, creating the account when it does not exist.

    `email` becomes the tenant's contact address for the member (and the new
    account's address when one is created); the tenant never learns an
    existing account's own address or name. The answer says no more about an
    existing account than inviting needs: that no setup link is due.
    Raises ValidationError when the user is already a member or the input is
    malformed, PermissionDenied when `role` is above the actor's own.
    """
    actor_role = require_role(actor, tenant, Role.ADMIN)
    granted = _check_grantable(actor_role, role)
    _checked_input(username, email)
    user, created = _existing_or_new_user(username, email)
    if Membership.all_tenants.filter(tenant=tenant, user=user).exists():
        raise invalid("username", "already_member", f"{username} is already a member of this tenant.")
    membership = Membership.all_tenants.create(tenant=tenant, user=user, role=granted, email=email)
    record_audit_event(
        actor=actor,
        action="membership.create",
        obj=membership,
        tenant_id=tenant.pk,
        after=_membership_snapshot(membership),
    )
    return Invitation(membership=membership, setup_path=_setup_path(user) if created else None)


def _admins_left_without(membership: Membership) -> int:
    return (
        Membership.all_tenants.filter(tenant_id=membership.tenant_id, role=Role.ADMIN).exclude(pk=membership.pk).count()
    )


def _guard_last_admin(actor_role: Role, membership: Membership) -> None:
    if membership.role == Role.ADMIN and actor_role != Role.OPERATOR and _admins_left_without(membership) == 0:
        raise Conflict("A tenant must keep at least one admin.", code="last_admin")


@transaction.atomic
def update_member(
    *, actor: Actor, membership: Membership, role: str | None = None, projects: list[Project] | None = None
) -> Membership:
    """Change a member's role and/or projects in one audited step.

    Raises PermissionDenied for a role above the actor's own or a member
    above the actor, Conflict when it would leave the tenant without an
    admin, ValidationError for a project of another tenant.
    """
    actor_role = require_role(actor, membership.tenant, Role.ADMIN)
    membership = Membership.all_tenants.select_for_update().select_related("user").get(pk=membership.pk)
    if not actor_role.at_least(Role(membership.role)):
        raise PermissionDenied("You cannot change someone whose role is above yours.")
    changes: dict[str, object] = {}
    if role is not None:
        granted = _check_grantable(actor_role, role)
        if granted != Role.ADMIN:
            _guard_last_admin(actor_role, membership)
        changes["role"] = granted
    if projects is not None:
        if any(project.tenant_id != membership.tenant_id for project in projects):
            raise invalid("projects", "does_not_exist", "Every project must belong to this tenant.")
        changes["projects"] = projects
    return update_audited(
        actor=actor,
        action="membership.update",
        obj=membership,
        changes=changes,
        tenant_id=membership.tenant_id,
        audited=_membership_snapshot,
    )


@transaction.atomic
def remove_member(*, actor: Actor, membership: Membership) -> None:
    """End a membership; the user's tokens for the tenant stop working at once. Conflict for the last admin."""
    actor_role = require_role(actor, membership.tenant, Role.ADMIN)
    membership = Membership.all_tenants.select_for_update().select_related("user").get(pk=membership.pk)
    if not actor_role.at_least(Role(membership.role)):
        raise PermissionDenied("You cannot remove someone above you.")
    _guard_last_admin(actor_role, membership)
    delete_audited(
        actor=actor,
        action="membership.delete",
        obj=membership,
        tenant_id=membership.tenant_id,
        audited=_membership_snapshot,
    )
