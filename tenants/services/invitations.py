"""Invitations: how a person comes to work in a tenant, only ever with their own consent.

User names are global, so a tenant admin who names one cannot know whether
it is taken, nor by whom. Hence:

- Inviting never adds anybody. It writes a pending `Invitation` and returns
  a one-time link for the admin to pass on; the answer has the same shape
  whether or not the name is taken anywhere (nothing about other tenants'
  accounts leaks to the inviter).
- The link's secret is the proof that the person opening it is the one the
  admin meant. For a name nobody holds, the link lets them create the
  account with a password of their choosing, and join. For a name that is
  taken, they must also be signed in as that account, and accept (or
  decline). An account's owner never joins a tenant without both: neither
  another tenant's admin holding a stale link nor somebody who took the
  name first can join in the invitee's place.
- A link works once, for INVITATION_TTL_HOURS, and only while pending;
  withdrawing the invitation or answering it ends it.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Prefetch
from django.urls import reverse
from django.utils import timezone

from common.errors import Conflict, invalid
from tenants.choices import INVITATION_TRANSITIONS, InvitationState, Role
from tenants.context import Actor
from tenants.models import Invitation, Membership, Project, Tenant
from tenants.scoping import tenant_scope
from tenants.services.access import require_role
from tenants.services.audit import JsonDict, record_audit_event, update_audited
from tenants.services.members import checked_invitation, membership_snapshot
from tenants.services.tokens import digest  # one stored form for every secret: its SHA-256


@dataclass(frozen=True)
class IssuedInvitation:
    """A new invitation and the path of its one-time link, which exists only here (only a digest is stored)."""

    invitation: Invitation
    link_path: str


def _projects_of(invitation: Invitation) -> list[Project]:
    """Return the projects `invitation` joins; the caller holds its tenant's scope."""
    return list(Project.objects.filter(invitations=invitation).order_by("slug"))


def _snapshot(invitation: Invitation) -> JsonDict:
    return {
        "username": invitation.username,
        "email": invitation.email,
        "role": invitation.role,
        "projects": sorted(p.slug for p in _projects_of(invitation)) if invitation.pk else [],
        "state": invitation.state,
        "expires_at": invitation.expires_at.isoformat(),
    }


def _withdraw_expired(tenant: Tenant, username: str) -> None:
    """End a pending invitation of `username` to `tenant` whose link expired, so a new one can be made."""
    with tenant_scope(tenant):
        INVITATION_TRANSITIONS.move(
            Invitation.objects.filter(username=username, expires_at__lte=timezone.now()),
            from_states=[InvitationState.PENDING],
            to_state=InvitationState.REVOKED,
            answered_at=timezone.now(),
        )


@transaction.atomic
def invite_member(
    *,
    actor: Actor,
    tenant: Tenant,
    username: str,
    email: str = "",
    role: str = Role.MEMBER,
    projects: Sequence[str] = (),
) -> IssuedInvitation:
    """Invite `username` to `tenant` with `role`, on the projects named by `projects` (slugs); return the
    invitation and its one-time link. Nobody joins until the invitation is accepted (see the module).

    The answer is the same whether or not an account of that name exists.
    `email` is the tenant's contact address for the member (and a new
    account's address). Raises one ValidationError naming every malformed
    field (user name, address, role, projects that are not the tenant's, a
    user already a member or already invited), PermissionDenied when `role`
    is above the actor's own.
    """
    actor_role = require_role(actor, tenant, Role.ADMIN)
    _withdraw_expired(tenant, username)
    granted, chosen = checked_invitation(
        actor_role, tenant, username=username, email=email, role=role, projects=projects
    )
    secret = secrets.token_urlsafe(32)
    with tenant_scope(tenant):
        invitation = Invitation.objects.create(
            tenant=tenant,
            username=username,
            email=email,
            role=granted,
            digest=digest(secret),
            invited_by=actor.user,
            expires_at=timezone.now() + timedelta(hours=settings.INVITATION_TTL_HOURS),
        )
        invitation.projects.set(chosen)
        record_audit_event(
            actor=actor, action="invitation.create", obj=invitation, tenant_id=tenant.pk, after=_snapshot(invitation)
        )
    return IssuedInvitation(invitation, reverse("frontend:invitation", kwargs={"secret": secret}))


def open_invitation(secret: str) -> Invitation | None:
    """Return the pending, unexpired invitation whose link carries `secret`, with its tenant, or None.

    Used before anyone is signed in, so it reads across tenants: the secret
    is the capability, and a wrong, used or expired one names nothing.
    """
    projects = Prefetch("projects", queryset=Project.all_tenants.order_by("slug"))
    invitation = (
        Invitation.all_tenants.select_related("tenant")
        .prefetch_related(projects)
        .filter(digest=digest(secret), state=InvitationState.PENDING, tenant__is_active=True)
        .first()
    )
    if invitation is None or invitation.expires_at <= timezone.now():
        return None
    return invitation


def _claimed(secret: str, to_state: InvitationState) -> Invitation:
    """Move the open invitation of `secret` to `to_state` (compare-and-swap) and return it; Conflict when
    it is not open (used, withdrawn, expired or unknown: the same answer for each)."""
    invitation = open_invitation(secret)
    moved = 0
    if invitation is not None:
        with tenant_scope(invitation.tenant):
            moved = INVITATION_TRANSITIONS.move(
                Invitation.objects.filter(pk=invitation.pk),
                from_states=[InvitationState.PENDING],
                to_state=to_state,
                answered_at=timezone.now(),
            )
    if invitation is None or moved != 1:
        raise _gone()
    invitation.state = to_state
    return invitation


def _join(actor: Actor, invitation: Invitation, user: User) -> Membership:
    """Make `user` a member as `invitation` says; Conflict when they already are one."""
    # The invitee has no tenant scope yet: the rows written and read here are the inviting tenant's.
    with tenant_scope(invitation.tenant):
        if Membership.objects.filter(user=user).exists():
            raise Conflict(f"You are already a member of {invitation.tenant.name}.", code="already_member")
        membership = Membership.objects.create(
            tenant_id=invitation.tenant_id, user=user, role=invitation.role, email=invitation.email
        )
        membership.projects.set(_projects_of(invitation))
        Invitation.objects.filter(pk=invitation.pk).update(user=user)
        record_audit_event(
            actor=actor,
            action="membership.create",
            obj=membership,
            tenant_id=invitation.tenant_id,
            after=membership_snapshot(membership),
        )
    return membership


@transaction.atomic
def accept_invitation(*, actor: Actor, secret: str) -> Membership:
    """Accept the invitation of `secret` as the signed-in account it is addressed to; return the membership.

    Raises ValidationError on `secret` (`gone`) when the link no longer works, then
    PermissionDenied when the actor is not a signed-in user of that name
    (API tokens, which act inside one tenant, cannot accept), Conflict
    (`already_member`) when the account is a member already.
    """
    invitation = open_invitation(secret)
    if invitation is None:
        raise invalid("secret", "gone", _GONE)
    if actor.user is None or actor.token is not None:
        raise PermissionDenied("Sign in with your password to accept an invitation.")
    if invitation.username != actor.user.get_username():
        raise PermissionDenied(f"This invitation is for {invitation.username}; sign in as that user to accept it.")
    invitation = _claimed(secret, InvitationState.ACCEPTED)
    return _join(actor, invitation, actor.user)


@transaction.atomic
def decline_invitation(*, actor: Actor, secret: str) -> Invitation:
    """Decline the invitation of `secret` as the account it is addressed to; return it. Raises as
    `accept_invitation` does, less the membership check."""
    invitation = open_invitation(secret)
    if invitation is None:
        raise invalid("secret", "gone", _GONE)
    if actor.user is None or actor.token is not None:
        raise PermissionDenied("Sign in with your password to decline an invitation.")
    if invitation.username != actor.user.get_username():
        raise PermissionDenied(f"This invitation is for {invitation.username}; sign in as that user to answer it.")
    declined = _claimed(secret, InvitationState.DECLINED)
    record_audit_event(
        actor=actor,
        action="invitation.decline",
        obj=declined,
        tenant_id=declined.tenant_id,
        after={"state": "declined"},
    )
    return declined


def name_is_free(username: str) -> bool:
    """Return whether no account holds `username`: whether an invitation's link may create it."""
    return not User.objects.filter(username=username).exists()


@transaction.atomic
def create_invited_account(*, secret: str, password: str) -> User:
    """Create the account the invitation of `secret` names, with `password`, make it a member and return it.

    Only for a name nobody holds: Conflict (`name_taken`) when an account
    has it (its owner signs in and accepts instead), Conflict (`gone`) when
    the link no longer works. Raises ValidationError on `password` when it
    fails the password rules; nothing is written then.
    """
    invitation = open_invitation(secret)
    if invitation is None:
        raise _gone()
    user = User(username=invitation.username, email=invitation.email)
    try:
        validate_password(password, user)
    except ValidationError as error:
        raise ValidationError({"password": error.error_list}) from None
    user.set_password(password)
    try:
        with transaction.atomic():
            user.save()
    except IntegrityError:
        raise _name_taken(invitation.username) from None
    invitation = _claimed(secret, InvitationState.ACCEPTED)
    actor = Actor(user=user)
    record_audit_event(actor=actor, action="user.create", obj=user, tenant_id=None, after={"username": user.username})
    _join(actor, invitation, user)
    return user


# One answer for a used, withdrawn, expired or made-up link: none of them names anything.
_GONE = "This invitation link no longer works: ask your tenant admin for a new one."


def _gone() -> Conflict:
    return Conflict(_GONE, code="gone")


def _name_taken(username: str) -> Conflict:
    return Conflict(f"An account named {username} exists: sign in as {username} to accept.", code="name_taken")


@transaction.atomic
def withdraw_invitation(*, actor: Actor, invitation: Invitation) -> Invitation:
    """Withdraw a pending invitation (its link stops working); tenant admins only. Withdrawing one already
    answered changes nothing and writes no event. Raises PermissionDenied, Http404."""
    require_role(actor, invitation.tenant, Role.ADMIN)
    with tenant_scope(invitation.tenant):
        invitation = Invitation.objects.select_for_update(of=("self",)).get(pk=invitation.pk)
        if invitation.state != InvitationState.PENDING:
            return invitation
        # The row is locked in a state the table lets move: a plain save is the swap.
        revoked = INVITATION_TRANSITIONS.check(invitation.state, InvitationState.REVOKED)
        return update_audited(
            actor=actor,
            action="invitation.withdraw",
            obj=invitation,
            changes={"state": revoked, "answered_at": timezone.now()},
            tenant_id=invitation.tenant_id,
            audited=_snapshot,
        )
