"""Doorbells: a waiter blocks until its bell rings or its wait ends, at no cost while it waits.

Distributed (REDIS_URL set) a bell is a Redis list: ringing pushes to it
(expiring after a minute), waiting is one BLPOP on it, so a thousand waiters
are a thousand idle Redis connections and no work in this process. Embedded,
a bell is a condition in this process, where everything rings and waits. The
two differ only in where the bell lives.

A ring wakes one waiter, or the next one to wait within the minute; a
waiter woken by an old ring simply looks and finds nothing new, so callers
treat a ring as "look again", never as a message.
"""

from __future__ import annotations

import threading
from functools import cache
from typing import Any

from django.conf import settings

_PREFIX = "gpucloud:doorbell:"
_RING_SECONDS = 60


@cache
def _redis() -> Any:
    import redis

    return redis.Redis.from_url(str(settings.REDIS_URL))


_local_lock = threading.Lock()
_local: dict[str, threading.Condition] = {}
_local_rings: dict[str, int] = {}


def _condition(name: str) -> threading.Condition:
    with _local_lock:
        return _local.setdefault(name, threading.Condition())


def ring(name: str) -> None:
    """Ring bell `name`: its waiter (or the next within a minute) wakes. Raises what Redis raises."""
    if settings.REDIS_URL:
        key = _PREFIX + name
        with _redis().pipeline() as pipe:
            pipe.rpush(key, 1)
            pipe.expire(key, _RING_SECONDS)
            pipe.execute()
        return
    condition = _condition(name)
    with condition:
        _local_rings[name] = _local_rings.get(name, 0) + 1
        condition.notify()


def silence(name: str) -> None:
    """Forget the rings of bell `name` so far (call before looking, then wait: no ring is missed)."""
    if settings.REDIS_URL:
        _redis().delete(_PREFIX + name)
        return
    with _condition(name):
        _local_rings.pop(name, None)


def wait(name: str, timeout: float) -> bool:
    """Block until bell `name` rings or `timeout` seconds pass; return whether it rang."""
    if timeout <= 0:
        return False
    if settings.REDIS_URL:
        return _redis().blpop([_PREFIX + name], timeout=timeout) is not None
    condition = _condition(name)
    with condition:
        rang = condition.wait_for(lambda: _local_rings.get(name, 0) > 0, timeout=timeout)
        if rang:
            _local_rings[name] -= 1
        return bool(rang)
