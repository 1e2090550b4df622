"""What the published OpenAPI schema says about errors: every operation lists the error statuses it can answer.

Every error body is the envelope of `common.api.errors` (the `Error`
component). Which statuses an operation can return follows from its shape:

- 400 when it takes a body or query parameters, or writes (validation);
- 401 and 403 always (every operation needs a credential, most a role);
- 404 when its path names an object (or a tenant), it lists (a page
  past the last one), or it takes `format` (a format the route does not render);
- 409 when it writes (a concurrent change, a state that forbids it);
- 413 and 415 when it takes a body (JSON only, at most 16 MiB);
- 429 always while throttling is on (common.api.throttling), with `Retry-After`;
- 500 always (with a request id to quote).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema

from common.api.throttling import throttling_enabled

ERROR_COMPONENT = {
    "type": "object",
    "description": "The error envelope of every 4xx and 5xx answer.",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "request_id"],
            "properties": {
                "code": {"type": "string", "description": "Stable and machine-readable."},
                "message": {"type": "string", "description": "For people."},
                "request_id": {"type": "string", "description": "Quote it to an operator: it is in the logs."},
                "fields": {
                    "type": "object",
                    "description": "Each invalid input field, with every rule it broke.",
                    "additionalProperties": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                        },
                    },
                },
                "details": {"type": "object", "description": "409 only: facts such as the current state."},
            },
        }
    },
}
_DESCRIPTIONS = {
    "400": "Invalid input: every failing field and its rule.",
    "401": "No credential, or one that is not valid (any more).",
    "403": "The credential's role does not allow this.",
    "404": "No such object within the credential's reach.",
    "409": "The change conflicts with the object's state or a concurrent change.",
    "413": "The body is larger than the API reads (16 MiB).",
    "415": "The body is not JSON (Content-Type: application/json).",
    "429": "Over the API's rate for this token, user or address; retry after Retry-After seconds.",
    "500": "An unexpected error; the request id identifies it in the logs.",
}
_WRITES = {"post", "put", "patch", "delete"}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}


def error_statuses(method: str, operation: dict[str, Any], *, throttled: bool = False) -> list[str]:
    """Return the error statuses `operation` (an OpenAPI operation object for `method`) can answer.

    `throttled`: whether the API's throttles are on, so that any operation may answer 429.
    """
    kinds = {parameter.get("in") for parameter in operation.get("parameters", [])}
    names = {parameter.get("name") for parameter in operation.get("parameters", [])}
    statuses = ["401", "403", "500"] + (["429"] if throttled else [])
    if "requestBody" in operation or "query" in kinds or method in _WRITES - {"delete"}:
        statuses.append("400")
    if "requestBody" in operation:
        statuses += ["413", "415"]
    if "path" in kinds or "page" in names or "format" in names:
        statuses.append("404")
    if method in _WRITES:
        statuses.append("409")
    return sorted(statuses)


def add_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the `Error` component, and each operation's error answers."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_COMPONENT
    envelope = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    throttled = throttling_enabled()
    for item in result.get("paths", {}).values():
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for status in error_statuses(method, operation, throttled=throttled):
                answer: dict[str, Any] = {"description": _DESCRIPTIONS[status], "content": envelope}
                if status == "429":
                    answer["headers"] = _RETRY_AFTER
                operation["responses"].setdefault(status, answer)
    return result


class SingleObjectSchema(AutoSchema):
    """The schema of a view whose `list` answers one object (such as `/me/`), not a page of them."""

    def _is_list_view(self, serializer: Any = None) -> bool:
        return False
