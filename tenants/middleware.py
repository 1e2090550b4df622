"""Per-request context: request id, client address, interface, and the tenant scope's reset."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from common.requests import client_address
from tenants.choices import Via
from tenants.context import RequestInfo, request_info
from tenants.scoping import deactivate_tenant

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{8,64}$")


def _request_id(request: HttpRequest) -> str:
    """Return the caller's X-Request-ID when it is well formed, else a fresh one."""
    offered = request.headers.get("X-Request-ID", "")
    return offered if _REQUEST_ID.match(offered) else uuid.uuid4().hex


def _via(path: str) -> Via:
    if path.startswith("/api/"):
        return Via.API
    if path.startswith("/admin/"):
        return Via.ADMIN
    return Via.UI


def request_info_for(request: HttpRequest) -> RequestInfo:
    """Return the audit context of `request`: its id, the client's address and the interface it came through."""
    return RequestInfo(request_id=_request_id(request), source_ip=client_address(request), via=_via(request.path))


class RequestContextMiddleware:
    """Set the request's audit context for its duration and clear any tenant scope at its end."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        info = request_info_for(request)
        with request_info(info):
            try:
                response = self.get_response(request)
            finally:
                deactivate_tenant()
        response["X-Request-ID"] = info.request_id
        return response
