"""The API's throttles: per API token, per user and per anonymous client address (DRF's SimpleRateThrottle).

They are REST_FRAMEWORK's DEFAULT_THROTTLE_CLASSES, so every API view
counts its requests against them once it has authenticated them; their
rates are DEFAULT_THROTTLE_RATES (`API_THROTTLE_*` in the environment),
and a rate of None turns that throttle off. A request over a rate answers
429 `throttled` with `Retry-After` (common.api.errors). Counters live in
Django's default cache: Redis when distributed, shared by every web
process; process memory when embedded.

The submission ingest, which answers submissions in front of DRF, runs
the submission views' own `check_throttles`, so its requests count the same.
"""

from __future__ import annotations

from typing import Any, cast

from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle


def _rates() -> dict[str, str | None]:
    # The stubs type DRF's rates as numbers; they are "COUNT/PERIOD" strings, or None.
    return cast(dict[str, str | None], api_settings.DEFAULT_THROTTLE_RATES)


class _CurrentRate(SimpleRateThrottle):
    def get_rate(self) -> str | None:
        # DRF's own reads the rates its module saw at import; these are read as each request starts,
        # so that a settings change (a test's) applies.
        return _rates().get(self.scope or "")


class TokenThrottle(_CurrentRate):
    """Requests made with one API token (`request.auth`); requests of a browser session are not counted here."""

    scope = "token"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        # `request.auth` is the API token of a token request (tenants.authentication), None otherwise.
        token_id = getattr(request.auth, "pk", None)
        if token_id is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": token_id}


class UserThrottle(_CurrentRate):
    """Requests of one user, all of their tokens and browser sessions together; anonymous ones are not counted here."""

    scope = "user"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if not request.user.is_authenticated:
            return None
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}


class AnonymousThrottle(_CurrentRate, AnonRateThrottle):
    """Requests with no credential, per client address (REST_FRAMEWORK's NUM_PROXIES says which)."""


def throttling_enabled() -> bool:
    """Return whether any API throttle has a rate, that is whether the API may answer 429."""
    return any(rate is not None for rate in _rates().values())
