"""The hand-off from the console to a notebook's own origin: a one-time ticket, then that origin's own cookie.

Notebooks are served on an origin that is not the console's
(`settings.NOTEBOOK_ORIGIN`), so the console's session cookie is no login
there. The console (signed in, with the proxy's own access check) issues a
ticket and sends the browser to the notebook origin's entry URL; the
notebook origin redeems it once and sets a cookie of its own, scoped to
that notebook's path. Both live in the default cache (Redis when
distributed), never in process memory, so a ticket is single use across
web processes too and a cookie works on each of them.

A notebook cookie stands for (user, notebook, console session): every
proxied request asks again whether that console session still signs that
user in and whether the user may still open that notebook, so a logout,
a password change or a lost role ends the notebook's access at once, as
before the split.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.core.cache import BaseCache, cache

from jobs.selectors import notebook_proxy_target

ENTRY = "gpucloud-enter"
"""The entry path under a notebook's base path on its origin: `/notebooks/<id>/gpucloud-enter?ticket=...`."""
DEFAULT_NEXT = "lab"
_TICKETS = "jobs:notebook-ticket:"
_COOKIES = "jobs:notebook-cookie:"


@dataclass(frozen=True)
class NotebookEntry:
    """What a notebook cookie stands for: who entered which notebook, signed in with which console session."""

    user_id: int
    workload_id: int
    console_session: str = field(repr=False)


def _key(prefix: str, secret: str) -> str:
    # Only a digest reaches the cache: whoever reads the cache cannot replay a ticket or a cookie.
    return prefix + hashlib.sha256(secret.encode()).hexdigest()


def safe_next(path: str | None) -> str:
    """Return `path` (a path inside the notebook, e.g. `lab/tree/a.ipynb`) when it stays there, else `lab`.

    No empty, `.` or `..` segment and no backslash: the browser is sent to
    `/notebooks/<id>/<path>` on the notebook origin and nowhere else.
    """
    inside = (path or "").lstrip("/")
    *segments, last = inside.split("/")
    if not inside or "\\" in inside or any(s in ("", ".", "..") for s in segments) or last in (".", ".."):
        return DEFAULT_NEXT
    return inside


def issue_ticket(
    *,
    user: AbstractBaseUser | AnonymousUser,
    console_session: str | None,
    workload_id: int,
    next_path: str | None = None,
    store: BaseCache | None = None,
) -> str | None:
    """Return a ticket that lets `user` enter notebook `workload_id` once, or None when they may not open it.

    The same rule as every proxied request (`notebook_proxy_target`). The
    ticket is valid NOTEBOOK_HANDOFF_SECONDS and only for this notebook;
    it carries the console session it was issued under (`console_session`,
    None means no session: no ticket).
    """
    if console_session is None or notebook_proxy_target(user, workload_id) is None:
        return None
    ticket = secrets.token_urlsafe(32)
    value = {"user": user.pk, "workload": workload_id, "session": console_session, "next": safe_next(next_path)}
    (store or cache).set(_key(_TICKETS, ticket), value, timeout=settings.NOTEBOOK_HANDOFF_SECONDS)
    return ticket


def entry_url(workload_id: int, ticket: str) -> str:
    """Return the notebook origin's URL that redeems `ticket` for notebook `workload_id`."""
    origin = settings.NOTEBOOK_ORIGIN
    assert origin is not None  # the console does not start without one (jobs/checks.py)
    return f"{origin.origin_of(workload_id)}/notebooks/{workload_id}/{ENTRY}?{urlencode({'ticket': ticket})}"


def redeem_ticket(ticket: str, *, workload_id: int, store: BaseCache | None = None) -> tuple[str, str] | None:
    """Spend `ticket` for notebook `workload_id`: return (a new notebook cookie's value, the path to open), or None.

    None for an unknown, expired or already spent ticket and for a ticket
    of another notebook (which is spent all the same). Single use across
    processes: of two redemptions, only the one whose delete removed the
    cache entry gets a cookie.
    """
    store = store or cache
    key = _key(_TICKETS, ticket)
    value: dict[str, Any] | None = store.get(key)
    if value is None or not store.delete(key) or value["workload"] != workload_id:
        return None
    cookie = secrets.token_urlsafe(32)
    entry = {"user": value["user"], "workload": workload_id, "session": value["session"]}
    store.set(_key(_COOKIES, cookie), entry, timeout=settings.SESSION_COOKIE_AGE)
    return cookie, quote(value["next"], safe="/:@!$&'()*+,;=-._~")


def notebook_entry(cookie: str | None, workload_id: int, *, store: BaseCache | None = None) -> NotebookEntry | None:
    """Return what notebook cookie `cookie` stands for when it was issued for notebook `workload_id`, else None."""
    if not cookie:
        return None
    value: dict[str, Any] | None = (store or cache).get(_key(_COOKIES, cookie))
    if value is None or value["workload"] != workload_id:
        return None
    return NotebookEntry(user_id=value["user"], workload_id=workload_id, console_session=value["session"])
