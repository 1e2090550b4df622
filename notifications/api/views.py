"""The notifications API: thin adapters over notifications.services and notifications.selectors.

Tenant admins manage their tenant's webhook endpoints and read their
delivery log; operators the platform's. Everyone chooses their own e-mail
per event kind and reads the e-mails sent to them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from common.errors import FieldErrors
from notifications import selectors, services
from notifications.api import serializers as s
from notifications.filters import DeliveryFilter
from notifications.models import Delivery, NotificationPreference, WebhookEndpoint
from tenants.api.base import BaseViewSet, PlatformViewSet, TenantViewSet
from tenants.choices import Role
from tenants.models import Tenant

_READ = (mixins.ListModelMixin, mixins.RetrieveModelMixin)
KIND_PATTERN = r"[a-z_]+\.[a-z_]+"


def _tenant_of(view: BaseViewSet) -> Tenant | None:
    """The tenant of a tenant endpoint, None on a platform endpoint."""
    return getattr(view, "tenant", None)


def _rules(view: BaseViewSet) -> Callable[[dict[str, Any]], FieldErrors]:
    """The service's own checks of endpoint fields, run beside the serializer's so every field is named at once."""
    tenant = _tenant_of(view)
    return lambda values: services.webhook_errors(values, tenant_id=tenant.pk if tenant is not None else None)


class _WebhookWrites:
    """Create, change, delete and rotate the secret of endpoints: the same for a tenant's and the platform's."""

    @extend_schema(request=s.WebhookCreateSerializer, responses={201: s.IssuedWebhookSerializer})
    def create(self: Any, request: Request, **kwargs: str) -> Response:
        data = self.validated_input(s.WebhookCreateSerializer, rules=_rules(self))
        issued = services.create_webhook(actor=self.actor, tenant=_tenant_of(self), **data)
        return _issued(issued, status.HTTP_201_CREATED)

    @extend_schema(request=s.WebhookUpdateSerializer, responses=s.WebhookSerializer)
    def partial_update(self: Any, request: Request, **kwargs: str) -> Response:
        data = self.validated_input(s.WebhookUpdateSerializer, partial=True, rules=_rules(self))
        return self.respond(services.update_webhook(actor=self.actor, endpoint=self.get_object(), changes=data))

    def destroy(self: Any, request: Request, **kwargs: str) -> Response:
        services.delete_webhook(actor=self.actor, endpoint=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=s.IssuedWebhookSerializer)
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self: Any, request: Request, **kwargs: str) -> Response:
        """Give the endpoint a new secret, shown in this answer only; the old one stops signing at once."""
        return _issued(services.rotate_webhook_secret(actor=self.actor, endpoint=self.get_object()))


def _issued(issued: services.IssuedWebhook, code: int = status.HTTP_200_OK) -> Response:
    body = dict(s.WebhookSerializer(issued.endpoint).data)
    body["secret"] = issued.secret
    return Response(body, status=code)


class TenantWebhookEndpoint(_WebhookWrites, *_READ, TenantViewSet):  # type: ignore[misc]
    """The tenant's webhook endpoints: its admins read and manage them. The secret is in the answers of create
    and rotate-secret only."""

    serializer_class = s.WebhookSerializer
    read_role = Role.ADMIN
    ordering_fields = ["created_at", "url"]
    filterset_fields = ["is_active"]

    def scoped_queryset(self) -> QuerySet[WebhookEndpoint]:
        return selectors.endpoints_in_scope().select_related("created_by")


class PlatformWebhookEndpoint(_WebhookWrites, *_READ, PlatformViewSet):  # type: ignore[misc]
    """The platform's webhook endpoints (node health): operators read and manage them."""

    serializer_class = s.WebhookSerializer
    read_role = Role.OPERATOR
    ordering_fields = ["created_at", "url"]
    filterset_fields = ["is_active"]

    def scoped_queryset(self) -> QuerySet[WebhookEndpoint]:
        return selectors.platform_endpoints().select_related("created_by")


class TenantWebhookDeliveryEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]
    """The tenant's webhook delivery log, newest first: every attempt, its status or error. Admins read."""

    serializer_class = s.DeliverySerializer
    read_role = Role.ADMIN
    filterset_class = DeliveryFilter

    def scoped_queryset(self) -> QuerySet[Delivery]:
        return selectors.webhook_deliveries_in_scope()


class PlatformWebhookDeliveryEndpoint(*_READ, PlatformViewSet):  # type: ignore[misc]
    """The platform's webhook delivery log, newest first: operators read."""

    serializer_class = s.DeliverySerializer
    read_role = Role.OPERATOR
    filterset_class = DeliveryFilter

    def scoped_queryset(self) -> QuerySet[Delivery]:
        return selectors.platform_webhook_deliveries()


class TenantEmailEndpoint(mixins.ListModelMixin, TenantViewSet):
    """The e-mails sent to the caller about this tenant, newest first (their own only, whatever their role)."""

    serializer_class = s.DeliverySerializer
    filterset_fields = ["state"]

    def scoped_queryset(self) -> QuerySet[Delivery]:
        return selectors.emails_to(self.request.user, self.tenant.pk)  # type: ignore[arg-type]


class PlatformEmailEndpoint(mixins.ListModelMixin, PlatformViewSet):
    """The e-mails sent to the calling operator about the platform (node health), newest first."""

    serializer_class = s.DeliverySerializer
    read_role = Role.OPERATOR
    filterset_fields = ["state"]

    def scoped_queryset(self) -> QuerySet[Delivery]:
        return selectors.emails_to(self.request.user, None)  # type: ignore[arg-type]


class _Choices:
    """The caller's own e-mail choice per event kind: list them all, read one, change one (`{"email": bool}`).

    The choices are a fixed, short list with defaults filled in: not a page of rows, so not paginated or filtered.
    """

    def _choices(self: Any) -> list[selectors.EmailChoice]:
        tenant = _tenant_of(self)
        return selectors.email_choices(self.request.user, tenant.pk if tenant is not None else None)

    def _choice(self: Any, kind: str) -> selectors.EmailChoice:
        found = [choice for choice in self._choices() if choice.kind == kind]
        if not found:
            raise Http404("No such event kind here.")
        return found[0]

    @extend_schema(responses=s.EmailChoiceSerializer(many=True))
    def list(self: Any, request: Request, **kwargs: str) -> Response:
        return Response([s.choice_data(choice) for choice in self._choices()])

    def retrieve(self: Any, request: Request, kind: str, **kwargs: str) -> Response:
        return Response(s.choice_data(self._choice(kind)))

    @extend_schema(request=s.EmailChoiceUpdateSerializer, responses=s.EmailChoiceSerializer)
    def partial_update(self: Any, request: Request, kind: str, **kwargs: str) -> Response:
        self._choice(kind)
        data = self.validated_input(s.EmailChoiceUpdateSerializer)
        services.set_email_choices(actor=self.actor, tenant=_tenant_of(self), choices={kind: data["email"]})
        return Response(s.choice_data(self._choice(kind)))


class TenantEmailChoiceEndpoint(_Choices, TenantViewSet):
    """Which of the tenant's event kinds reach the caller by e-mail; everyone in the tenant chooses their own."""

    serializer_class = s.EmailChoiceSerializer
    queryset = NotificationPreference.all_tenants.none()  # names the model for the OpenAPI schema only
    lookup_field = "kind"
    lookup_value_regex = KIND_PATTERN
    pagination_class = None
    filter_backends: list[Any] = []
    write_role = Role.VIEWER

    def scoped_queryset(self) -> QuerySet[NotificationPreference]:
        return NotificationPreference.objects.none()


class PlatformEmailChoiceEndpoint(_Choices, PlatformViewSet):
    """Which of the platform's event kinds (node health) reach the calling operator by e-mail."""

    serializer_class = s.EmailChoiceSerializer
    queryset = NotificationPreference.all_tenants.none()  # names the model for the OpenAPI schema only
    lookup_field = "kind"
    lookup_value_regex = KIND_PATTERN
    pagination_class = None
    filter_backends: list[Any] = []
    read_role = Role.OPERATOR

    def scoped_queryset(self) -> QuerySet[NotificationPreference]:
        return NotificationPreference.all_tenants.none()
