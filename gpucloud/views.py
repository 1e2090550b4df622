"""Project-level endpoints: health and the API's catch-all 404."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache

from gpucloud.api.errors import error_body


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Answer 200 when the database answers, 503 otherwise; for load balancers and compose."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        return JsonResponse({"status": "unavailable", "database": "unreachable"}, status=503)
    return JsonResponse({"status": "ok"})


def api_not_found(request: HttpRequest) -> JsonResponse:
    """Answer unknown API paths in the API's error format rather than with an HTML page."""
    return JsonResponse(error_body("not_found", "No such API endpoint."), status=404)
