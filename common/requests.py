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
