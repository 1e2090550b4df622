"""Who is acting and through which request: the facts every audit event records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.requests import RequestInfo, current_request_info, request_info
from tenants.choices import Role

__all__ = ["SYSTEM", "Actor", "RequestInfo", "current_request_info", "request_info"]

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from tenants.models import ApiToken


@dataclass(frozen=True)
class Actor:
    """The principal behind an action: a user, optionally through one API token.

    `user` is None for the system itself (workers, migrations). A token caps
    the user's rights: its tenant is the only one it reaches, its role the
    highest it acts with.
    """

    user: User | None
    token: ApiToken | None = None

    @property
    def label(self) -> str:
        return self.user.get_username() if self.user is not None else "system"

    @property
    def is_operator(self) -> bool:
        """Return whether the actor has platform-operator rights right now."""
        if self.user is None or not self.user.is_active or not self.user.is_staff:
            return False
        return self.token is None or self.token.role == Role.OPERATOR


SYSTEM = Actor(user=None)
