"""Project-level endpoints: health, Prometheus metrics and the API's catch-all 404."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from gpucloud.api.errors import error_body
from gpucloud.metrics import metrics_refusal, render_metrics


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Answer 200 when the database answers, 503 otherwise; for load balancers and compose."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        return JsonResponse({"status": "unavailable", "database": "unreachable"}, status=503)
    return JsonResponse({"status": "ok"})


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """Answer Prometheus with the console's metrics, or 401/403 with a one-line reason (see docs/metrics.md)."""
    refusal = metrics_refusal(request)
    if refusal is not None:
        response = HttpResponse(f"{refusal.message}\n", status=refusal.status, content_type="text/plain; charset=utf-8")
        if refusal.status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    body, content_type = render_metrics(request.headers.get("Accept", ""))
    return HttpResponse(body, content_type=content_type)


def api_not_found(request: HttpRequest) -> JsonResponse:
    """Answer unknown API paths in the API's error format rather than with an HTML page."""
    return JsonResponse(error_body("not_found", "No such API endpoint."), status=404)
