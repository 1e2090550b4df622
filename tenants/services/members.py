"""Members of a tenant: the checks of an invitation, roles, project assignment, removal.

Role grants are bounded by the granter: only tenant admins (and operators)
manage members, nobody grants a role above their own, and operator rights
are never granted through a membership. A tenant keeps at least one admin
unless an operator decides otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import validate_email
from django.db import transaction

from common.errors import Conflict, invalid
from tenants.choices import InvitationState, Role
from tenants.context import Actor
from tenants.models import Invitation, Membership, Project, Tenant
from tenants.scoping import tenant_scope
from tenants.services.access import request_work_sweep, require_role
from tenants.services.audit import JsonDict, delete_audited, update_audited

_USERNAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@.+-_")


def membership_snapshot(membership: Membership) -> JsonDict:
    """Return how the audit log records a membership: its user's name, contact address, role and projects."""
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


def _input_errors(username: str, email: str, role: str) -> dict[str, list[ValidationError]]:
    """Return every malformed part of an invitation to the tenant in scope, by field (empty when the input is
    well-formed)."""
    errors: dict[str, list[ValidationError]] = {}
    if not username or len(username) > 150 or not set(username) <= _USERNAME_CHARS:
        errors["username"] = [ValidationError("Use up to 150 letters, digits and @ . + - _ characters.", "invalid")]
    elif Membership.objects.filter(user__username=username).exists():
        errors["username"] = [ValidationError(f"{username} is already a member of this tenant.", "already_member")]
    elif Invitation.objects.filter(username=username, state=InvitationState.PENDING).exists():
        message = f"{username} is already invited; withdraw that invitation to send a new one."
        errors["username"] = [ValidationError(message, "already_invited")]
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
    with tenant_scope(tenant):
        found = {p.slug: p for p in Project.objects.filter(slug__in=set(slugs))}
    unknown = [slug for slug in slugs if slug not in found]
    if unknown:
        raise invalid("projects", "does_not_exist", f"No project {', '.join(unknown)} in this tenant.")
    return [found[slug] for slug in dict.fromkeys(slugs)]


def checked_invitation(
    actor_role: Role, tenant: Tenant, *, username: str, email: str, role: str, projects: Sequence[str]
) -> tuple[Role, list[Project]]:
    """Return the role to grant and the projects to join; raises one ValidationError naming every bad field,
    or PermissionDenied when `role` is above `actor_role`."""
    with tenant_scope(tenant):
        errors = _input_errors(username, email, role)
    chosen: list[Project] = []
    try:
        chosen = projects_named(tenant, projects)
    except ValidationError as error:
        errors.update(error.error_dict)
    if errors:
        raise ValidationError(errors)
    return _check_grantable(actor_role, role), chosen


def _admins_left_without(membership: Membership) -> int:
    """Return how many admins the tenant in scope (the membership's) keeps without `membership`."""
    return Membership.objects.filter(role=Role.ADMIN).exclude(pk=membership.pk).count()


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
    tenant = membership.tenant
    actor_role = require_role(actor, tenant, Role.ADMIN)
    # Under the membership's tenant's scope, whatever scope the caller holds (none for the CLI and tasks).
    with tenant_scope(tenant):
        return _update_member(actor, actor_role, membership, role=role, projects=projects)


def _update_member(
    actor: Actor, actor_role: Role, membership: Membership, *, role: str | None, projects: list[Project] | None
) -> Membership:
    membership = Membership.objects.select_for_update(of=("self",)).select_related("user").get(pk=membership.pk)
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
        audited=membership_snapshot,
    )


@transaction.atomic
def remove_member(*, actor: Actor, membership: Membership) -> None:
    """End a membership; the user's tokens for the tenant stop working at once and their running work stops
    within a minute (`request_work_sweep`: jobs cancelled, notebooks hibernated). Conflict for the last admin."""
    tenant = membership.tenant
    actor_role = require_role(actor, tenant, Role.ADMIN)
    with tenant_scope(tenant):
        membership = Membership.objects.select_for_update(of=("self",)).select_related("user").get(pk=membership.pk)
        if not actor_role.at_least(Role(membership.role)):
            raise PermissionDenied("You cannot remove someone above you.")
        _guard_last_admin(actor_role, membership)
        request_work_sweep()
        delete_audited(
            actor=actor,
            action="membership.delete",
            obj=membership,
            tenant_id=membership.tenant_id,
            audited=membership_snapshot,
        )
