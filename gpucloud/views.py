"""Project-level endpoints: health, Prometheus metrics, and the API's catch-all 404 and its 500."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import csrf, defaults
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

from common.api.errors import error_body
from common.api.middleware import server_error_response
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


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: under /api/ the API's JSON envelope with the request id, elsewhere Django's page.

    Reached by any exception nothing else handled (in a view, a serializer,
    a middleware), after Django logged it with its traceback.
    """
    if request.path.startswith("/api/"):
        return server_error_response()
    return defaults.server_error(request)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: under /api/ the API's JSON 403, elsewhere Django's page."""
    if request.path.startswith("/api/"):
        message = f"CSRF check failed: {reason or 'missing or wrong token'}. API clients use a bearer token."
        return JsonResponse(error_body("csrf_failed", message), status=403)
    return csrf.csrf_failure(request, reason=reason)


@csrf_exempt  # it changes nothing; a CSRF refusal would answer an unknown path with an HTML page
def api_not_found(request: HttpRequest) -> JsonResponse:
    """Answer unknown API paths in the API's error format rather than with an HTML page."""
    return JsonResponse(error_body("not_found", "No such API endpoint."), status=404)
