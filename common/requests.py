"""The request an action came through (its id, the client's address, the interface), for as long as it runs.

Set by the request middleware (tenants.middleware) and read wherever an
answer or a record names the request: the API's error envelope, the audit
log. Outside a request it is empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest


@dataclass(frozen=True)
class RequestInfo:
    """The request an action came through; empty for actions from the CLI or workers."""

    request_id: str = ""
    source_ip: str | None = None
    via: str = "system"
    """How it came (tenants.choices.Via: api, ui, admin, cli, system)."""


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


def client_address(request: HttpRequest) -> str | None:
    """Return the address a request came from: the socket's peer, or behind the trusted proxy its view of it.

    With TRUST_X_FORWARDED_FOR the last X-Forwarded-For entry is taken: it is
    the one the proxy wrote, whether it replaced the header or appended to
    it. Earlier entries come from the client and could name any address,
    loopback included. The audit log, the login lockout, the metrics' network
    check and DRF's throttles (NUM_PROXIES) all read the address this way.
    """
    if settings.TRUST_X_FORWARDED_FOR:
        forwarded = request.headers.get("X-Forwarded-For", "").split(",")[-1].strip()
        if forwarded:
            return forwarded
    return request.META.get("REMOTE_ADDR") or None
