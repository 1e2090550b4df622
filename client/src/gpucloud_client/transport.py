"""What the sync and async clients share about HTTP: calls, retries, and reading answers.

A `Call` is one API request described without I/O (method, path, query, body, headers, whether it may be
retried, and how to read its answer). `RetryPolicy` decides whether and how long to wait before trying a
call again; `decode` turns an answer into the call's result or raises `ApiError` from the error envelope.
The clients only send calls (`Client._call`, `AsyncClient._call`), so every rule lives here once.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar

from gpucloud_client.config import Context
from gpucloud_client.errors import ApiError, ConnectionFailed, FieldError

R = TypeVar("R")

USER_AGENT = "gpucloud-client/0.1.0"
RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_RETRY_AFTER = 120.0  # seconds: a longer Retry-After is waited only this long before trying again


@dataclass(frozen=True)
class Call(Generic[R]):
    """One API request: `path` is relative to `<url>/api/v1/`; `parse` reads the decoded JSON answer.

    `idempotent` calls (GETs, submissions with their Idempotency-Key, the workload actions) may be sent
    again after a connection error or a 429/502/503/504; no others are.
    """

    method: str
    path: str
    parse: Callable[[Any], R]
    params: dict[str, str] = field(default_factory=dict)
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    idempotent: bool = True


def new_idempotency_key() -> str:
    """Return a fresh Idempotency-Key (random: a submission's retries share one, two submissions never)."""
    return f"gpc-{uuid.uuid4().hex}"


def http_options(context: Context, timeout: float, transport: Any = None) -> dict[str, Any]:
    """Return the keyword arguments of `httpx.Client`/`httpx.AsyncClient` for `context`.

    Every request carries the token as a Bearer header (never in the URL) and has `timeout` seconds.
    Redirects are not followed: a redirect to another host must not receive the token.
    """
    options: dict[str, Any] = {
        "base_url": context.api_url,
        "headers": {
            "Authorization": f"Bearer {context.token}",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        },
        "timeout": timeout,
        "follow_redirects": False,
    }
    if transport is not None:
        options["transport"] = transport
    return options


class RetryPolicy:
    """When to send a call again: up to `retries` more times, waiting `backoff` seconds doubling, jittered.

    A 429 waits what its Retry-After says (capped at MAX_RETRY_AFTER). `jitter` returns a factor in
    [0.5, 1); it is a parameter so tests can pin it.
    """

    def __init__(self, retries: int = 4, backoff: float = 0.25, jitter: Callable[[], float] | None = None) -> None:
        self.retries = max(0, retries)
        self.backoff = max(0.0, backoff)
        self._jitter = jitter or (lambda: 0.5 + random.random() / 2)  # noqa: S311 - jitter, not a secret

    def delay(self, call: Call[Any], attempt: int, status: int | None, retry_after: str | None = None) -> float | None:
        """Return how long to wait before sending `call` again, or None to stop.

        `attempt` counts the tries made so far from 0; `status` is the answer's status, or None when the
        connection failed (refused, reset, timed out).
        """
        if not call.idempotent or attempt >= self.retries:
            return None
        if status is not None and status not in RETRY_STATUSES:
            return None
        if status == 429:
            waited = parse_retry_after(retry_after)
            if waited is not None:
                return min(waited, MAX_RETRY_AFTER)
        return self.backoff * (2.0**attempt) * self._jitter()


def parse_retry_after(value: str | None) -> float | None:
    """Return the seconds of a Retry-After header given in seconds (the API's form), else None."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def decode(call: Call[R], status: int, headers: Mapping[str, str], content: bytes) -> R:
    """Return the result of `call` from a 2xx answer; raises ApiError for any other status."""
    if not 200 <= status < 300:
        raise api_error(status, headers, content)
    if status == 204 or not content:
        return call.parse(None)
    try:
        data = json.loads(content)
    except ValueError:
        raise ApiError(status, "invalid_response", "the console answered something that is not JSON") from None
    return call.parse(data)


def api_error(status: int, headers: Mapping[str, str], content: bytes) -> ApiError:
    """Return the ApiError of a non-2xx answer, read from the API's envelope.

    An answer without the envelope (a proxy's HTML page, an empty 502) still gives an ApiError naming the
    status, with the request id from X-Request-ID when there is one.
    """
    retry_after = parse_retry_after(headers.get("Retry-After"))
    request_id = headers.get("X-Request-ID")
    try:
        envelope = json.loads(content) if content else None
    except ValueError:
        envelope = None
    error = envelope.get("error") if isinstance(envelope, dict) else None
    if not isinstance(error, dict):
        return ApiError(
            status, f"http_{status}", _status_message(status), request_id=request_id, retry_after=retry_after
        )
    details = error.get("details")
    return ApiError(
        status,
        str(error.get("code") or f"http_{status}"),
        str(error.get("message") or _status_message(status)),
        fields=parse_fields(error.get("fields")),
        request_id=str(error.get("request_id") or request_id or "") or None,
        details=details if isinstance(details, dict) else {},
        retry_after=retry_after,
    )


def parse_fields(raw: Any) -> dict[str, list[FieldError]]:
    """Return the envelope's `fields` as {path: [FieldError]}, tolerating a bare message for a rule."""
    if not isinstance(raw, dict):
        return {}
    fields: dict[str, list[FieldError]] = {}
    for path, errors in raw.items():
        items = errors if isinstance(errors, list) else [errors]
        fields[str(path)] = [_field_error(item) for item in items]
    return fields


def _field_error(item: Any) -> FieldError:
    if isinstance(item, dict):
        return FieldError(str(item.get("code") or "invalid"), str(item.get("message") or ""))
    return FieldError("invalid", str(item))


def _status_message(status: int) -> str:
    known = {
        401: "not authenticated: the token is missing, wrong, revoked or expired",
        403: "not allowed",
        404: "not found",
        429: "too many requests",
        502: "the console is unavailable (bad gateway)",
        503: "the console is unavailable",
        504: "the console did not answer in time (gateway timeout)",
    }
    return known.get(status, f"the console answered HTTP {status}")


def connection_failed(context: Context, error: Exception) -> ConnectionFailed:
    """Return the error of a request that could not reach the console (the message names the URL only)."""
    reason = str(error) or type(error).__name__
    return ConnectionFailed(f"cannot reach the console at {context.url}: {reason}")


class ClientBase:
    """What `Client` and `AsyncClient` share beside sending: the context, the timeout, the retry policy."""

    def __init__(self, context: Context, *, timeout: float, retries: int, backoff: float) -> None:
        self.context = context
        self.timeout = timeout
        self.policy = RetryPolicy(retries, backoff)

    @property
    def tenant(self) -> str | None:
        """Return the tenant the client works in (the context's)."""
        return self.context.tenant

    def for_tenant(self, tenant: str | None) -> Self:
        """Return a client for `tenant` (this one when None or the same) sharing this one's connections.

        Closing either closes both: close the one you made first.
        """
        if tenant is None or tenant == self.tenant:
            return self
        other = copy.copy(self)
        other.context = dataclasses.replace(self.context, tenant=tenant)
        return other
