"""The test suite's cache keys (tests/conftest.py sets them for every cache).

Each test gets a cache namespace of its own, a `KEY_PREFIX` changed in
place in `settings.CACHES`. The prefix is read here, when a key is made,
not when a cache object is: so the namespace reaches every cache object,
whichever thread or context made it and however long ago, without
assigning `settings.CACHES` anew. That assignment makes Django build a new
cache handler, whose new `asgiref.local.Local` leaves one more context
variable in the main thread's context for good; after a few thousand tests
every sync/async hop (asgiref copies each variable across) cost seconds.
The key has the layout of Django's own (`prefix:version:key`), so a process
started by a test with the same prefix, on Django's key function, reads the
same keys.
"""

from __future__ import annotations

from django.conf import settings


def key(key: str, key_prefix: str, version: int) -> str:
    """Return the key of `key` in the current test's namespace (the suite has one cache, `default`)."""
    return f"{settings.CACHES['default'].get('KEY_PREFIX', '')}:{version}:{key}"
