"""An exception a view did not handle answers the API's JSON 500 under /api/, DEBUG or not."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from common.api.errors import error_body

log = logging.getLogger("django.request")

SERVER_ERROR_MESSAGE = "An unexpected error occurred; quote the request id to an operator."


def server_error_response() -> JsonResponse:
    """Return the API's 500: the envelope with the request id, nothing of the error itself."""
    return JsonResponse(error_body("server_error", SERVER_ERROR_MESSAGE), status=500)


class ApiExceptionMiddleware:
    """Answer a view's unhandled exception under /api/ with the JSON 500, logged with its traceback.

    Without it Django's own handling decides: `handler500` (also JSON under
    /api/) with DEBUG off, but the HTML debug page with DEBUG on, which API
    clients and the fuzz must never get.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not request.path.startswith("/api/"):
            return None
        log.error("Internal Server Error: %s", request.path, exc_info=exception, extra={"status_code": 500})
        return server_error_response()
