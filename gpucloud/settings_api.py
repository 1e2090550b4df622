"""The API's settings (DRF, its throttles and the OpenAPI schema), read from the environment like the rest.

`gpucloud.settings` takes them from here; this module holds them apart only
so that each settings module stays readable at one sitting.

Throttles (docs/api.md): requests allowed per API token, per user (all of
their tokens and browser sessions together) and per anonymous client
address, as COUNT/PERIOD (second, minute, hour or day) or "off";
API_THROTTLE=0 turns all three off. Counters are in the default cache:
Redis when distributed, so every web process counts together; process
memory when embedded, which is one process.
"""

from __future__ import annotations

from typing import Any

from gpucloud.env import env_bool, env_rate


def api_settings(*, num_proxies: int) -> tuple[bool, dict[str, Any]]:
    """Return (API_THROTTLE, REST_FRAMEWORK); `num_proxies`: the proxies trusted to write X-Forwarded-For."""
    throttle = env_bool("API_THROTTLE", True)
    rates = {
        "token": env_rate("API_THROTTLE_TOKEN_RATE", "1200/min"),
        "user": env_rate("API_THROTTLE_USER_RATE", "2400/min"),
        "anon": env_rate("API_THROTTLE_ANON_RATE", "60/min"),
    }
    return throttle, {
        "DEFAULT_AUTHENTICATION_CLASSES": [
            "tenants.authentication.ApiTokenAuthentication",
            "rest_framework.authentication.SessionAuthentication",
        ],
        "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
        "DEFAULT_PAGINATION_CLASS": "common.api.pagination.Pagination",
        "DEFAULT_FILTER_BACKENDS": [
            "common.api.filters.FilterBackend",
            "rest_framework.filters.OrderingFilter",
            "rest_framework.filters.SearchFilter",
        ],
        "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
        "EXCEPTION_HANDLER": "common.api.errors.exception_handler",
        "DEFAULT_RENDERER_CLASSES": ["common.api.renderers.JSONRenderer"],
        # JSON only: one encoding with real types (a form's "" and "true" are not an integer, null or a boolean).
        "DEFAULT_PARSER_CLASSES": ["common.api.parsers.JSONParser"],
        "DEFAULT_CONTENT_NEGOTIATION_CLASS": "common.api.negotiation.StrictContentNegotiation",
        "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
        "DEFAULT_THROTTLE_CLASSES": [
            "common.api.throttling.TokenThrottle",
            "common.api.throttling.UserThrottle",
            "common.api.throttling.AnonymousThrottle",
        ],
        # A malformed rate stops start-up even with throttling off: the typo would bite when it is turned on.
        "DEFAULT_THROTTLE_RATES": {scope: rate if throttle else None for scope, rate in rates.items()},
        # The client address of an anonymous request: the socket's peer, or behind a trusted proxy the
        # X-Forwarded-For entry that proxy wrote (the last), never one the client could have written.
        "NUM_PROXIES": num_proxies,
    }


SCHEMA_SETTINGS = {
    "TITLE": "gpucloud API",
    "DESCRIPTION": "Multi-tenant GPU cloud console. Authenticate with `Authorization: Bearer <token>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "/static/vendor/swagger-ui",
    "SWAGGER_UI_FAVICON_HREF": "/static/gpucloud/favicon.svg",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "common.api.schema.add_error_responses",
    ],
    "ENUM_NAME_OVERRIDES": {
        "MembershipRoleEnum": "tenants.choices.MEMBERSHIP_ROLES",
        "RoleEnum": "tenants.choices.Role",
        "NodeKindEnum": "inventory.choices.NodeKind",
        "WorkloadKindEnum": "jobs.choices.WorkloadKind",
        "WorkloadStateEnum": "jobs.choices.WorkloadState",
        "VolumeKindEnum": "inventory.choices.VolumeKind",
        "StorageKindEnum": "inventory.choices.StorageKind",
        "FileKindEnum": "inventory.choices.FileKind",
        "EventKindEnum": "notifications.choices.EventKind",
        "DeliveryStateEnum": "notifications.choices.DeliveryState",
        "RequestKindEnum": "accounting.choices.RequestKind",
        "RequestStateEnum": "accounting.choices.RequestState",
        "InvitationStateEnum": "tenants.choices.InvitationState",
    },
}
"""SPECTACULAR_SETTINGS: the schema's title, its error responses (common.api.schema) and the enums' names."""
