"""Members of a tenant: invitations, roles, project assignment, removal.

Role grants are bounded by the granter: only tenant admins (and operators)
manage members, nobody grants a role above their own, and operator rights
are never granted through a membership. A tenant keeps at least one admin
unless an operator decides otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.contrib.auth.tokens import default_token_generator
from django.core import signing
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlencode, urlsafe_base64_encode

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


# Signs the user name an invitation link carries, so that a link already used can still say whose it was.
_INVITATION_SALT = "gpucloud.invitation"


def _setup_path(user: User) -> str:
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    path = reverse("frontend:accept_invite", kwargs={"uidb64": uid, "token": default_token_generator.make_token(user)})
    return f"{path}?{urlencode({'as': signing.dumps(user.get_username(), salt=_INVITATION_SALT)})}"


def invited_username(signed: str) -> str | None:
    """Return the user name an invitation link carries in its `as` parameter, or None when the value
    is not one an invitation made (so nobody learns a name by guessing links)."""
    try:
        return str(signing.loads(signed, salt=_INVITATION_SALT))
    except signing.BadSignature:
        return None


def _input_errors(tenant: Tenant, username: str, email: str, role: str) -> dict[str, list[ValidationError]]:
    """Return every malformed part of an invitation, by field (empty when the input is well-formed)."""
    errors: dict[str, list[ValidationError]] = {}
    if not username or len(username) > 150 or not set(username) <= _USERNAME_CHARS:
        errors["username"] = [ValidationError("Use up to 150 letters, digits and @ . + - _ characters.", "invalid")]
    elif Membership.all_tenants.filter(tenant=tenant, user__username=username).exists():
        errors["username"] = [ValidationError(f"{username} is already a member of this tenant.", "already_member")]
    if email:
        try:
            validate_email(email)
        except ValidationError:
            errors["email"] = [ValidationError("Enter a valid email address.", "invalid")]
    if role not in {Role.VIEWER, Role.MEMBER, Role.ADMIN}:
        errors["role"] = [ValidationError("Role must be one of viewer, member or admin.", "invalid_choice")]
    return errors


def projects_named(tenant: Tenant, slugs: Sequence[str]) -> list[Project]:
    """Return `tenant`'s projects named by `slugs`, in their order; raises ValidationError on `projects`
    naming every slug that is no project of `tenant` (another tenant's project is no exception)."""
    found = {p.slug: p for p in Project.all_tenants.filter(tenant=tenant, slug__in=set(slugs))}
    unknown = [slug for slug in slugs if slug not in found]
    if unknown:
        raise invalid("projects", "does_not_exist", f"No project {', '.join(unknown)} in this tenant.")
    return [found[slug] for slug in dict.fromkeys(slugs)]


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


def _checked_invitation(
    actor_role: Role, tenant: Tenant, *, username: str, email: str, role: str, projects: Sequence[str]
) -> tuple[Role, list[Project]]:
    """Return the role to grant and the projects to join; raises one ValidationError naming every bad field,
    or PermissionDenied when `role` is above `actor_role`."""
    errors = _input_errors(tenant, username, email, role)
    chosen: list[Project] = []
    try:
        chosen = projects_named(tenant, projects)
    except ValidationError as error:
        errors.update(error.error_dict)
    if errors:
        raise ValidationError(errors)
    return _check_grantable(actor_role, role), chosen


@transaction.atomic
def invite_member(
    *,
    actor: Actor,
    tenant: Tenant,
    username: str,
    email: str = "",
    role: str = Role.MEMBER,
    projects: Sequence[str] = (),
) -> Invitation:
    """Make `username` a member of `tenant` with `role`, on the projects named by `projects` (slugs),
    creating the account when it does not exist.

    `email` becomes the tenant's contact address for the member (and the new
    account's address when one is created); the tenant never learns an
    existing account's own address or name. The answer says no more about an
    existing account than inviting needs: that no setup link is due.
    Raises one ValidationError naming every malformed field (user name,
    address, role, projects that are not the tenant's, a user already a
    member), PermissionDenied when `role` is above the actor's own.
    """
    actor_role = require_role(actor, tenant, Role.ADMIN)
    granted, chosen = _checked_invitation(
        actor_role, tenant, username=username, email=email, role=role, projects=projects
    )
    user, created = _existing_or_new_user(username, email)
    membership = Membership.all_tenants.create(tenant=tenant, user=user, role=granted, email=email)
    membership.projects.set(chosen)
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
    membership = Membership.all_tenants.select_for_update(of=("self",)).select_related("user").get(pk=membership.pk)
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
    membership = Membership.all_tenants.select_for_update(of=("self",)).select_related("user").get(pk=membership.pk)
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
