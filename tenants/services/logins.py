"""Login lockout, which django-axes enforces, and expired browser sessions.

axes counts the failures of every password login (the console's and the
Django admin's) per (username, address), in the cache: Redis when
distributed, process memory when embedded. Its backend refuses a locked
pair before any password is checked. The policy is in settings (AXES_*,
from LOGIN_MAX_FAILURES and LOGIN_LOCKOUT_SECONDS). Here is what axes asks
of the project (which username and address an attempt counts against) and
what the project asks of axes (is a pair locked, forget its failures).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_cache_timeout
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.sessions.models import Session
from django.http import HttpRequest
from django.utils import timezone

from tenants.context import current_request_info


def _folded(username: str) -> str:
    return username.strip().lower()


def login_username(request: HttpRequest, credentials: Mapping[str, Any] | None) -> str | None:
    """Return the username a login attempt counts against (AXES_USERNAME_CALLABLE).

    Trimmed and lower-cased, so that "Alice " and "alice" share one count.
    """
    source = credentials if credentials is not None else request.POST
    username = source.get("username")
    return _folded(username) if isinstance(username, str) else None


def login_address(request: HttpRequest) -> str | None:
    """Return the address a login attempt counts against (AXES_CLIENT_IP_CALLABLE): the one the audit log records."""
    return current_request_info().source_ip


def login_locked_for(username: str, address: str | None) -> int:
    """Return for how many seconds, at most, logins of (username, address) stay locked; 0 when allowed.

    axes refuses such a login by itself; this lets a form say so before
    asking for it.
    """
    if not settings.AXES_ENABLED:
        return 0
    attempt = AccessAttempt(username=_folded(username), ip_address=address)
    if AxesProxyHandler.get_implementation().get_failures(attempt) < settings.AXES_FAILURE_LIMIT:
        return 0
    return int(get_cache_timeout() or 0)


def clear_login_failures(username: str, address: str | None) -> None:
    """Forget the failures of (username, address), lifting its lockout."""
    AxesProxyHandler.reset_attempts(username=_folded(username), ip_address=address)


def purge_expired_sessions() -> int:
    """Delete browser sessions past their expiry and return how many went; safe to run any time."""
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    return deleted
