"""Who is acting and through which request: the facts every audit event records."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tenants.choices import Role, Via

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from tenants.models import ApiToken


@dataclass(frozen=True)
class RequestInfo:
    """The request an action came through; empty for actions from the CLI or workers."""

    request_id: str = ""
    source_ip: str | None = None
    via: Via = Via.SYSTEM


_request_info: ContextVar[RequestInfo] = ContextVar(
    "gpucloud_request_info",
    default=RequestInfo(),  # noqa: B039 -- frozen dataclass, shared safely
)


def current_request_info() -> RequestInfo:
    """Return the request in progress, or an empty RequestInfo outside a request."""
    return _request_info.get()


@contextmanager
def request_info(info: RequestInfo) -> Iterator[RequestInfo]:
    """Run the block with `info` as the current request."""
    token = _request_info.set(info)
    try:
        yield info
    finally:
        _request_info.reset(token)


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
