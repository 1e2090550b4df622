"""The console's Content-Security-Policy (django-csp), with the page's own WebSocket origin allowed to connect.

The policy itself is the setting CONTENT_SECURITY_POLICY (gpucloud/settings.py):
scripts only from the console's own files (no inline script, no eval),
nothing may frame the console, no plugins, no <base> elsewhere. CSP's
'self' does not cover ws:/wss: in every browser, so each response also names
the WebSocket origin of the host it was asked for (the live views connect there).
"""

from __future__ import annotations

from csp.middleware import CSPMiddleware, PolicyParts
from django.http import HttpRequest, HttpResponseBase


def websocket_origin(request: HttpRequest) -> str:
    """Return the ws:// or wss:// origin of the host `request` was made to (the one its page's sockets open)."""
    return f"{'wss' if request.is_secure() else 'ws'}://{request.get_host()}"


class ConsoleCSPMiddleware(CSPMiddleware):
    """django-csp's middleware, adding the request's WebSocket origin to connect-src."""

    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        if not report_only:
            parts.update = {**(parts.update or {}), "connect-src": [websocket_origin(request)]}
        return parts
