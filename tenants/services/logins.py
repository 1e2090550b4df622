"""Login throttling: after repeated failures for one (username, address) the login is locked for a while.

Failures are counted in the cache (Redis when distributed, process memory
when embedded); a lockout slows guessing to LOGIN_MAX_FAILURES tries per
LOGIN_LOCKOUT_SECONDS per account and address, whatever the password.
"""

from __future__ import annotations

import hashlib
import time

from django.conf import settings
from django.contrib.sessions.models import Session
from django.core.cache import cache
from django.utils import timezone


def _key(username: str, address: str | None) -> str:
    raw = f"{username.strip().lower()}|{address or '-'}"
    return "login-failures:" + hashlib.sha256(raw.encode()).hexdigest()


def login_locked_for(username: str, address: str | None) -> int:
    """Return how many seconds logins for (username, address) stay locked; 0 when allowed."""
    record = cache.get(_key(username, address))
    if not record or record["count"] < settings.LOGIN_MAX_FAILURES:
        return 0
    return max(0, int(record["since"] + settings.LOGIN_LOCKOUT_SECONDS - time.time()))


def record_login_failure(username: str, address: str | None) -> int:
    """Count one failed login and return the failures counted in the current window."""
    key = _key(username, address)
    record = cache.get(key) or {"count": 0, "since": time.time()}
    record = {"count": record["count"] + 1, "since": time.time()}
    cache.set(key, record, timeout=settings.LOGIN_LOCKOUT_SECONDS)
    return int(record["count"])


def purge_expired_sessions() -> int:
    """Delete browser sessions past their expiry and return how many went; safe to run any time."""
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    return deleted


def clear_login_failures(username: str, address: str | None) -> None:
    """Forget the failures of (username, address) after a successful login."""
    cache.delete(_key(username, address))
