"""Roles and other enumerations of the tenancy app."""

from __future__ import annotations

from django.db import models

from common.transitions import Transitions


class Role(models.TextChoices):
    """A principal's role in a tenant, ordered from least to most rights.

    `operator` is platform staff; it is never stored on a membership, only on
    an operator's API token, and it outranks every tenant role.
    """

    VIEWER = "viewer", "Viewer"
    MEMBER = "member", "Member"
    ADMIN = "admin", "Tenant admin"
    OPERATOR = "operator", "Operator"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def at_least(self, other: Role) -> bool:
        """Return whether this role has every right of `other`."""
        return self.rank >= other.rank


_RANK = {Role.VIEWER: 1, Role.MEMBER: 2, Role.ADMIN: 3, Role.OPERATOR: 4}

MEMBERSHIP_ROLES = [(r.value, r.label) for r in (Role.VIEWER, Role.MEMBER, Role.ADMIN)]


class Via(models.TextChoices):
    """The interface through which an audited action came."""

    API = "api", "API"
    UI = "ui", "Web UI"
    ADMIN = "admin", "Django admin"
    CLI = "cli", "Command line"
    SYSTEM = "system", "System"


class InvitationState(models.TextChoices):
    """Where an invitation stands. Only a pending one can be answered, and only once; one past its
    `expires_at` is pending in the row but answers nothing (`Invitation.is_open`)."""

    PENDING = "invited", "Invited"
    ACCEPTED = "accepted", "Accepted"
    DECLINED = "declined", "Declined"
    REVOKED = "revoked", "Withdrawn"


# The answers an invitation may get: each ends it.
INVITATION_TRANSITIONS: Transitions[InvitationState] = Transitions(
    "invitation",
    InvitationState,
    {
        InvitationState.PENDING: frozenset(
            {InvitationState.ACCEPTED, InvitationState.DECLINED, InvitationState.REVOKED}
        ),
        InvitationState.ACCEPTED: frozenset(),
        InvitationState.DECLINED: frozenset(),
        InvitationState.REVOKED: frozenset(),
    },
)
