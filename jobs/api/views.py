"""API endpoints of the jobs app: thin adapters over jobs.services and jobs.selectors."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, renderers, status
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from common.api.schema import SingleObjectSchema
from jobs import selectors, services
from jobs.accounting_port import accounting
from jobs.api import image_serializers as im
from jobs.api import log_serializers as logs_s
from jobs.api import serializers as s
from jobs.api.filters import WorkloadFilter
from jobs.api.submission_errors import raise_rule_errors, unknown_keys, with_rule_errors
from jobs.models import AllowedImage, LaunchPreset, Workload
from jobs.services import images, presets
from jobs.services.spec import WorkloadSpec
from tenants.api.base import PlatformViewSet, TenantViewSet
from tenants.choices import Role
from tenants.models import Project

_READ = (mixins.ListModelMixin, mixins.RetrieveModelMixin)
IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Retrying with the same key and body returns the first result (200) instead of a duplicate.",
)


def _idempotency_key(request: Request) -> str | None:
    return request.headers.get("Idempotency-Key")


def _submission_input(view: TenantViewSet, *, bulk: bool) -> dict[str, Any]:
    """Return the view's validated submission body; raise naming every failing field, shape and rule alike."""
    assert view.input_serializer_class is not None
    try:
        data = view.validated_input(view.input_serializer_class)
    except ValidationError as refused:
        context = view.get_serializer_context()
        raise with_rule_errors(refused, view.request.data, context, actor=view.actor, bulk=bulk) from None
    if unknown_keys(view.request.data, bulk=bulk):
        # The serializer dropped keys it does not read (`privileged`, `volumes`): refuse them, with every other rule.
        nothing = ValidationError({})
        context = view.get_serializer_context()
        raise with_rule_errors(nothing, view.request.data, context, actor=view.actor, bulk=bulk)
    return data


def _budget_notes(project: Project, specs: list[WorkloadSpec]) -> list[str]:
    """Return what the budgets over `project` say about work of `specs` (asked of accounting)."""
    jobs = [(spec.gpus_per_replica * spec.replicas, spec.max_runtime_seconds) for spec in specs]
    return accounting().launch_notes(project, jobs, now=timezone.now())


def _status(submission: services.Submission) -> int:
    return status.HTTP_201_CREATED if submission.created else status.HTTP_200_OK


class _PlainTextRenderer(renderers.BaseRenderer):
    """Lets a client ask for a log download as text/plain; an error on that route is its JSON body as text."""

    media_type = "text/plain"
    format = "txt"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return json.dumps(data).encode()


def _log_text(workload: Workload, *, lines_per_block: int = 1000) -> Iterator[str]:
    """Yield the workload's log as text in blocks of lines (one write per block, not per line)."""
    block: list[str] = []
    for line in selectors.iter_log_lines(workload):
        block.append(f"{line['timestamp']} {line['stream']} {line['text']}\n")
        if len(block) >= lines_per_block:
            yield "".join(block)
            block = []
    if block:
        yield "".join(block)


def _log_filename(workload: Workload) -> str:
    """Return a download name that is safe in a header: `<name>-<id>.log` with odd characters replaced."""
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', workload.name)}-{workload.pk}.log"


class WorkloadEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]  # mypy cannot check bases unpacked from a tuple
    """A tenant's workloads: everyone in the tenant reads; members submit and cancel their own, admins any."""

    serializer_class = s.WorkloadSerializer
    input_serializer_class = s.WorkloadInputSerializer  # the submission ingest runs it too (jobs.api.fast_ingest_plan)
    write_role = Role.MEMBER
    filterset_class = WorkloadFilter
    ordering_fields = ["submitted_at", "state", "queue_position", "name"]
    search_fields = ["name"]

    def scoped_queryset(self) -> QuerySet[Workload]:
        if self.action == "retrieve":
            return selectors.workloads_with_details()
        return selectors.workloads_for_tenant()

    def get_serializer_class(self) -> Any:
        return s.WorkloadDetailSerializer if self.action == "retrieve" else s.WorkloadSerializer

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        actor = getattr(self, "actor", None)
        context["viewer_id"] = actor.user.pk if actor is not None and actor.user is not None else None
        # The role it acts with: the notebook rule counts a token's capped role and an operator's as no more;
        # what it may do to the workload (`actions`) follows from it too.
        context["viewer_role"] = getattr(self, "role", None)
        return context

    @extend_schema(
        request=s.WorkloadInputSerializer,
        responses={201: s.WorkloadSerializer, 200: s.WorkloadSerializer},
        parameters=[IDEMPOTENCY_KEY],
    )
    def create(self, request: Request, tenant: str) -> Response:
        data = _submission_input(self, bulk=False)
        project = data.pop("project")
        submission = services.submit(
            actor=self.actor, project=project, items=[data], idempotency_key=_idempotency_key(request)
        )
        return Response(s.workload_rows(submission.workloads)[0], status=_status(submission))

    @extend_schema(request=s.WorkloadInputSerializer, responses=s.ValidationResultSerializer)
    @action(detail=False, methods=["post"])
    def validate(self, request: Request, tenant: str) -> Response:
        """Check a submission against every rule a submission meets, the database's included; write nothing."""
        data = _submission_input(self, bulk=False)
        project = data.pop("project")
        specs = raise_rule_errors(self.actor, project, [data], bulk=False)
        return Response({"valid": True, "count": 1, "budget_notes": _budget_notes(project, specs)})

    @extend_schema(request=None, responses=s.WorkloadSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, tenant: str, pk: str) -> Response:
        return self.respond(services.cancel_workload(actor=self.actor, workload=self.get_object()))

    @extend_schema(request=None, responses=s.WorkloadSerializer)
    @action(detail=True, methods=["post"])
    def restart(self, request: Request, tenant: str, pk: str) -> Response:
        """Queue an ended workload again as a new attempt (409 while it has not ended or still holds GPUs)."""
        return self.respond(services.restart_workload(actor=self.actor, workload=self.get_object()))

    @extend_schema(request=None, responses=s.WorkloadSerializer)
    @action(detail=True, methods=["post"])
    def extend(self, request: Request, tenant: str, pk: str) -> Response:
        """Extend an idle-warned notebook once: its idle clock starts again."""
        return self.respond(services.extend_notebook(actor=self.actor, workload=self.get_object()))

    @extend_schema(request=None, responses=s.WorkloadSerializer)
    @action(detail=True, methods=["post"])
    def hibernate(self, request: Request, tenant: str, pk: str) -> Response:
        """Stop a notebook and keep it resumable: its GPU is freed, its files stay in its volumes."""
        return self.respond(services.hibernate_notebook(actor=self.actor, workload=self.get_object()))

    @extend_schema(request=None, responses=s.WorkloadSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, tenant: str, pk: str) -> Response:
        """Queue a hibernated notebook again with the same settings (a no-op when it was resumed already)."""
        return self.respond(services.resume_notebook(actor=self.actor, workload=self.get_object()))

    @extend_schema(parameters=[logs_s.LogQuerySerializer], responses=logs_s.LogPageSerializer)
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, tenant: str, pk: str) -> Response:
        """The last `limit` log lines, or with `since` the lines after it: poll with `next_since` until `complete`."""
        workload = self.get_object()
        query = logs_s.LogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        page = selectors.workload_log(
            workload, since=query.validated_data.get("since"), limit=query.validated_data["limit"]
        )
        return Response(logs_s.LogPageSerializer(page).data)

    @extend_schema(responses={(200, "text/plain"): OpenApiTypes.STR})
    @action(
        detail=True,
        methods=["get"],
        url_path="logs/download",
        url_name="logs-download",
        renderer_classes=[renderers.JSONRenderer, _PlainTextRenderer],
    )
    def logs_download(self, request: Request, tenant: str, pk: str) -> StreamingHttpResponse:
        """The whole stored log as text, one `timestamp stream text` line per log line."""
        workload = self.get_object()
        response = StreamingHttpResponse(_log_text(workload), content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{_log_filename(workload)}"'
        return response


class WorkloadBulkEndpoint(TenantViewSet):
    """Submit many workloads into one project in one all-or-nothing call (POST only)."""

    serializer_class = s.WorkloadSerializer
    input_serializer_class = s.BulkInputSerializer  # the submission ingest runs it too (jobs.api.fast_ingest_plan)
    write_role = Role.MEMBER

    def scoped_queryset(self) -> QuerySet[Workload]:
        return selectors.workloads_for_tenant()

    @extend_schema(
        request=s.BulkInputSerializer,
        responses={201: s.BulkResultSerializer, 200: s.BulkResultSerializer},
        parameters=[IDEMPOTENCY_KEY],
    )
    def create(self, request: Request, tenant: str) -> Response:
        data = _submission_input(self, bulk=True)
        submission = services.submit(
            actor=self.actor,
            project=data["project"],
            items=data["items"],
            idempotency_key=_idempotency_key(request),
            bulk=True,
        )
        body = {"count": len(submission.workloads), "results": s.workload_rows(submission.workloads)}
        return Response(body, status=_status(submission))

    @extend_schema(request=s.BulkInputSerializer, responses=s.ValidationResultSerializer)
    @action(detail=False, methods=["post"])
    def validate(self, request: Request, tenant: str) -> Response:
        """Check a bulk submission against every rule its submission meets; write nothing."""
        data = _submission_input(self, bulk=True)
        specs = raise_rule_errors(self.actor, data["project"], data["items"], bulk=True)
        notes = _budget_notes(data["project"], specs)
        return Response({"valid": True, "count": len(data["items"]), "budget_notes": notes})


class UsageEndpoint(TenantViewSet):
    """What the tenant's work holds and waits for against its quotas now; everyone in the tenant reads (GET only)."""

    serializer_class = s.UsageSerializer
    queryset = Workload.objects.none()  # for the schema only (its answer has no model): scoped_queryset serves
    pagination_class = None  # one object: the tenant's quotas, a handful of rows
    filter_backends: list[Any] = []
    schema = SingleObjectSchema()

    def scoped_queryset(self) -> QuerySet[Workload]:
        return selectors.workloads_for_tenant()

    @extend_schema(
        responses=s.UsageSerializer,
        # No model behind it: the tenant's slug is described here, not derived from a queryset.
        parameters=[
            OpenApiParameter("tenant", OpenApiTypes.STR, OpenApiParameter.PATH, description="A tenant's slug.")
        ],
    )
    def list(self, request: Request, tenant: str) -> Response:
        return Response(s.UsageSerializer({"quotas": selectors.quota_use_in_scope()}).data)


class AllowedImageEndpoint(mixins.ListModelMixin, mixins.RetrieveModelMixin, PlatformViewSet):
    """Allowed image patterns of the whole platform: operators list, add and remove them."""

    serializer_class = im.AllowedImageSerializer
    read_role = Role.OPERATOR
    filterset_fields = ["notebook"]
    search_fields = ["pattern", "description"]

    def scoped_queryset(self) -> QuerySet[AllowedImage]:
        return selectors.allowed_images_for_operators()

    @extend_schema(request=im.AllowedImageCreateSerializer, responses={201: im.AllowedImageSerializer})
    def create(self, request: Request) -> Response:
        data = self.validated_input(im.AllowedImageCreateSerializer)
        return self.respond(images.create_allowed_image(actor=self.actor, **data), status.HTTP_201_CREATED)

    def destroy(self, request: Request, pk: str) -> Response:
        images.delete_allowed_image(actor=self.actor, image=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class TenantImageEndpoint(mixins.ListModelMixin, TenantViewSet):
    """The image patterns a tenant may run: its own and the platform-wide ones (read-only).

    While no pattern exists anywhere on the platform every image is allowed (docs/images.md).
    """

    serializer_class = im.AllowedImageSerializer

    def scoped_queryset(self) -> QuerySet[AllowedImage]:
        return selectors.allowed_images_for_tenant(self.tenant.pk)

    def list(self, request: Request, tenant: str) -> Response:
        # The base filters its queryset to rows of this tenant, which would drop the
        # platform-wide patterns (no tenant); the selector names the tenant itself.
        queryset = self.filter_queryset(self.scoped_queryset())
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(self.get_serializer(page, many=True).data)


class LaunchPresetEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]  # mypy cannot check bases unpacked from a tuple
    """A tenant's launch presets: everyone in the tenant reads, tenant admins write."""

    serializer_class = im.LaunchPresetSerializer
    ordering_fields = ["name", "created_at"]
    search_fields = ["name", "description", "image"]

    def scoped_queryset(self) -> QuerySet[LaunchPreset]:
        return selectors.presets_for_tenant()

    @extend_schema(request=im.LaunchPresetInputSerializer, responses={201: im.LaunchPresetSerializer})
    def create(self, request: Request, tenant: str) -> Response:
        data = self.validated_input(im.LaunchPresetInputSerializer)
        preset = presets.create_preset(actor=self.actor, tenant=self.tenant, values=presets.PresetValues(**data))
        return self.respond(preset, status.HTTP_201_CREATED)

    @extend_schema(request=im.LaunchPresetInputSerializer, responses=im.LaunchPresetSerializer)
    def partial_update(self, request: Request, tenant: str, pk: str) -> Response:
        data = self.validated_input(im.LaunchPresetInputSerializer, partial=True)
        return self.respond(presets.update_preset(actor=self.actor, preset=self.get_object(), changes=data))

    def destroy(self, request: Request, tenant: str, pk: str) -> Response:
        presets.delete_preset(actor=self.actor, preset=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
