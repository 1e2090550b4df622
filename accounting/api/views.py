"""Usage reports and prices over the API: thin adapters over accounting's selectors and services."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, renderers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from accounting import selectors, services
from accounting.api import serializers as s
from accounting.export import csv_response
from accounting.models import Price
from accounting.options import PLATFORM_DIMENSIONS, TENANT_DIMENSIONS, ReportOptions, report_options
from accounting.selectors import Report
from common.api.schema import SingleObjectSchema
from jobs.models import Allocation
from tenants.api.base import PlatformViewSet, TenantViewSet
from tenants.choices import Role

_REPORT_PARAMETERS = [
    OpenApiParameter("period", OpenApiTypes.STR, enum=["this-month", "last-month", "custom"]),
    OpenApiParameter("start", OpenApiTypes.STR, description="Custom period: a date or ISO 8601 time (UTC)."),
    OpenApiParameter("end", OpenApiTypes.STR, description="Custom period: exclusive end."),
    OpenApiParameter("by", OpenApiTypes.STR, description="Comma-separated dimensions to group by (at most 3)."),
    OpenApiParameter("bucket", OpenApiTypes.STR, enum=["day", "month"], description="Rows per day or month."),
]


class _CsvRenderer(renderers.BaseRenderer):
    """Lets a client ask for the CSV export as text/csv; an error on that route is its JSON body as text."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return renderers.JSONRenderer().render(data)


def _asked(request: Request, allowed: tuple[str, ...], default_by: str) -> ReportOptions:
    """Return the report `request` asks for; raises ValidationError naming every bad parameter."""
    return report_options(
        request.query_params.dict(), allowed=allowed, default_by=default_by, now=timezone.now(), blank_is_default=False
    )


class TenantAccountingEndpoint(TenantViewSet):
    """What the tenant used in a period and what it cost, by project, user, pool, GPU model or workload.

    Tenant admins read; `csv/` is the same report as a CSV file.
    """

    read_role = Role.ADMIN
    serializer_class = s.ReportSerializer
    queryset = Allocation.objects.none()  # for the schema only: the report is read by accounting.selectors
    pagination_class = None
    filter_backends: list[Any] = []
    schema = SingleObjectSchema()

    def scoped_queryset(self) -> QuerySet[Allocation]:
        return Allocation.objects.all()

    def _report(self) -> Report:
        options = _asked(self.request, TENANT_DIMENSIONS, "project")
        return selectors.tenant_report(
            self.tenant, options.period, options.group_by, now=timezone.now(), bucket=options.bucket
        )

    @extend_schema(responses=s.ReportSerializer, parameters=_REPORT_PARAMETERS)
    def list(self, request: Request, tenant: str) -> Response:
        return Response(s.report_data(self._report()))

    @extend_schema(responses={(200, "text/csv"): OpenApiTypes.STR}, parameters=_REPORT_PARAMETERS)
    @action(detail=False, methods=["get"], url_path="csv", renderer_classes=[renderers.JSONRenderer, _CsvRenderer])
    def csv(self, request: Request, tenant: str) -> StreamingHttpResponse:
        return csv_response(self._report(), self.tenant.slug)


class PlatformAccountingEndpoint(PlatformViewSet):
    """What every tenant used in a period and what it cost: operators read; `csv/` as a CSV file."""

    read_role = Role.OPERATOR
    serializer_class = s.ReportSerializer
    queryset = Allocation.all_tenants.none()  # for the schema only
    pagination_class = None
    filter_backends: list[Any] = []
    schema = SingleObjectSchema()

    def scoped_queryset(self) -> QuerySet[Allocation]:
        return Allocation.all_tenants.none()

    def _report(self) -> Report:
        options = _asked(self.request, PLATFORM_DIMENSIONS, "tenant")
        return selectors.platform_report(options.period, options.group_by, now=timezone.now(), bucket=options.bucket)

    @extend_schema(responses=s.ReportSerializer, parameters=_REPORT_PARAMETERS)
    def list(self, request: Request) -> Response:
        return Response(s.report_data(self._report()))

    @extend_schema(responses={(200, "text/csv"): OpenApiTypes.STR}, parameters=_REPORT_PARAMETERS)
    @action(detail=False, methods=["get"], url_path="csv", renderer_classes=[renderers.JSONRenderer, _CsvRenderer])
    def csv(self, request: Request) -> StreamingHttpResponse:
        return csv_response(self._report(), "platform")


class PriceEndpoint(mixins.ListModelMixin, mixins.RetrieveModelMixin, PlatformViewSet):
    """Prices with their history: everyone signed in reads the platform-wide ones and those of the pools they
    may use; operators add them, and remove those not yet in effect (past reports never change)."""

    serializer_class = s.PriceSerializer
    filterset_fields = ["resource"]

    def scoped_queryset(self) -> QuerySet[Price]:
        return selectors.prices_visible_to(self.actor)

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "now": timezone.now()}

    @extend_schema(request=s.PriceCreateSerializer, responses={201: s.PriceSerializer})
    def create(self, request: Request) -> Response:
        data = self.validated_input(s.PriceCreateSerializer)
        price = services.add_price(actor=self.actor, now=timezone.now(), **data)
        return self.respond(price, status.HTTP_201_CREATED)

    def destroy(self, request: Request, pk: str) -> Response:
        services.remove_price(actor=self.actor, price=self.get_object(), now=timezone.now())
        return Response(status=status.HTTP_204_NO_CONTENT)
