"""One error format for the whole API.

Every error body is `{"error": {"code", "message", "fields"?, "request_id"}}`:
`code` is stable and machine-readable, `message` is for people, and
`fields` maps each invalid input field to a list of `{code, message}`;
`details` (409 only) carries facts such as the current state.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from common.api.parsers import UnstorableText
from common.errors import Conflict
from common.requests import current_request_info

_CODES = {
    status.HTTP_400_BAD_REQUEST: "validation_error",
    status.HTTP_401_UNAUTHORIZED: "not_authenticated",
    status.HTTP_403_FORBIDDEN: "permission_denied",
    status.HTTP_404_NOT_FOUND: "not_found",
    status.HTTP_405_METHOD_NOT_ALLOWED: "method_not_allowed",
    status.HTTP_409_CONFLICT: "conflict",
    status.HTTP_429_TOO_MANY_REQUESTS: "throttled",
}


def error_body(
    code: str,
    message: str,
    fields: dict[str, list[dict[str, str]]] | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the error envelope used by every API response with a 4xx or 5xx status."""
    body: dict[str, Any] = {"code": code, "message": message, "request_id": current_request_info().request_id}
    if fields:
        body["fields"] = fields
    if details:
        body["details"] = details
    return {"error": body}


def _field_errors(detail: Any) -> dict[str, list[dict[str, str]]]:
    if isinstance(detail, list):
        detail = {"non_field_errors": detail}
    result: dict[str, list[dict[str, str]]] = {}
    for field, errors in detail.items():
        items = errors if isinstance(errors, list) else [errors]
        for item in items:
            if isinstance(item, dict):
                for sub, nested in _field_errors(item).items():
                    result.setdefault(f"{field}.{sub}", []).extend(nested)
            else:
                result.setdefault(field, []).append({"code": getattr(item, "code", "invalid"), "message": str(item)})
    return result


def _validation_response(detail: Any) -> Response:
    fields = _field_errors(detail)
    first_field, first_errors = next(iter(fields.items()), ("", [{"message": "Invalid input."}]))
    where = "" if first_field == "non_field_errors" else f"{first_field}: "
    return Response(error_body("validation_error", f"{where}{first_errors[0]['message']}", fields), status=400)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Translate domain, Django and DRF exceptions into the API's error envelope, always as JSON.

    A route that also renders text (a log download asked for as text/plain)
    still answers its errors in JSON: the client reads one error format.
    """
    response = _error_response(exc, context)
    request = context.get("request")
    if response is not None and request is not None:
        request.accepted_renderer = JSONRenderer()
        request.accepted_media_type = JSONRenderer.media_type
    return response


def _error_response(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DjangoValidationError):
        return _validation_response(as_serializer_error(exc))
    if isinstance(exc, exceptions.ValidationError):
        return _validation_response(exc.detail)
    if isinstance(exc, UnstorableText):
        return _validation_response(exc.fields)
    if isinstance(exc, Conflict):
        return Response(error_body(exc.code, exc.message, details=exc.details), status=409)
    if isinstance(exc, OverflowError | DataError):
        # A value past a column's range that no field bounded (fields do: common.api.fields); still the
        # client's input, not a server fault.
        set_rollback()
        return Response(error_body("out_of_range", "A value is out of the range the database stores."), status=400)
    if isinstance(exc, IntegrityError):
        set_rollback()
        return Response(
            error_body("conflict", "The change clashes with a concurrent one; reload and try again."), status=409
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    detail = exc.detail if isinstance(exc, exceptions.APIException) else "Error."
    code = getattr(detail, "code", None) or _CODES.get(response.status_code, "error")
    response.data = error_body(code, str(detail))
    return response
