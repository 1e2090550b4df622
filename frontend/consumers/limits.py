"""The per-user cap on open live connections, shared by every web process through the cache.

A connection holds one of the user's LIVE_MAX_CONNECTIONS_PER_USER slots:
a cache key `live:conn:<user>:<slot>` taken with an atomic add, refreshed
by the connection's backstop re-check and deleted when it closes. The keys
expire (three re-check periods) so the slots of a web process that died
without closing its connections come free on their own.
"""

from __future__ import annotations

from django.conf import settings
from django.core.cache import cache


def _key(user_id: int, slot: int) -> str:
    return f"live:conn:{user_id}:{slot}"


def _ttl() -> int:
    return 3 * int(settings.LIVE_RECHECK_SECONDS)


def acquire_slot(user_id: int, holder: str) -> int | None:
    """Take a free connection slot of `user_id` for `holder` (a channel name); None when all are taken."""
    keys = [_key(user_id, slot) for slot in range(int(settings.LIVE_MAX_CONNECTIONS_PER_USER))]
    taken = cache.get_many(keys)
    for slot, key in enumerate(keys):
        # add is atomic: of two connections racing for one free slot, one gets it and the other tries the next.
        if key not in taken and cache.add(key, holder, timeout=_ttl()):
            return slot
    return None


def refresh_slot(user_id: int, slot: int, holder: str) -> None:
    """Extend the slot's lifetime; take it again if it expired meanwhile (a stalled process)."""
    key = _key(user_id, slot)
    if not cache.touch(key, timeout=_ttl()):
        cache.add(key, holder, timeout=_ttl())


def release_slot(user_id: int, slot: int, holder: str) -> None:
    """Free the slot if `holder` still holds it."""
    key = _key(user_id, slot)
    if cache.get(key) == holder:
        cache.delete(key)
