"""API endpoints of storage: a tenant's volumes, their shares and files; the operators' storage backends.

Who may see a volume and change its files is `inventory.services.volume_access`'s
(through `visible_volumes`, and the file services' own checks): another
tenant's volume, and a home that is not yours unless you administer the
tenant, answer 404; a write your rights do not allow, 403. Files are named
by `?path=` relative to the volume's top. Downloads stream the file;
uploads stream the raw request body (`PUT .../files/content/?path=`) into a
temporary file renamed into place only when complete and within quota.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db.models import QuerySet
from django.http import FileResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, renderers, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from common.api.errors import error_body
from common.api.schema import SingleObjectSchema
from common.downloads import file_download
from inventory.api import volume_serializers as s
from inventory.api.filters import VolumeFilter
from inventory.models import StorageBackend, Volume, VolumeShare
from inventory.services import storage, volume_files, volumes
from inventory.services.volume_access import rights_by_volume, visible_volumes
from tenants.api.base import PlatformViewSet, TenantViewSet
from tenants.choices import Role
from tenants.selectors import projects_in_scope

CHUNK = 1 << 20
"""Bytes read from an upload's body, or a download's file, at a time: memory stays flat however large."""
SLUG_PATTERN = r"[a-z0-9][a-z0-9-]{0,39}"
_READ = (mixins.ListModelMixin, mixins.RetrieveModelMixin)


class StorageUnreachable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The volume's storage cannot be reached from the console right now."
    default_code = "storage_unavailable"


class _BinaryRenderer(renderers.BaseRenderer):
    """Lets a client ask for a download as application/octet-stream; an error there is its JSON body."""

    media_type = "application/octet-stream"
    format = "bin"
    charset = None
    render_style = "binary"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return json.dumps(data).encode()


@contextmanager
def _file_errors() -> Iterator[None]:
    """Answer the file services' missing file (with its message) and unreachable storage as the API does."""
    try:
        yield
    except volume_files.FileNotFound as error:
        raise exceptions.NotFound(str(error)) from error
    except volume_files.StorageUnavailable as error:
        raise StorageUnreachable(str(error)) from error


def _too_large(error: volume_files.FileTooLarge) -> Response:
    """Return the 413 of an upload over its room: the envelope, naming the field `file` and the rule."""
    fields = {"file": [{"code": error.rule, "message": error.text}]}
    return Response(error_body("too_large", f"file: {error.text}", fields), status=413)


def _content_length(request: Request) -> int:
    """Return the upload's size from Content-Length; a body without one, or sent in chunks, is refused."""
    raw = request.META.get("CONTENT_LENGTH") or ""
    if request.META.get("HTTP_TRANSFER_ENCODING") or not raw.isascii() or not raw.isdigit():
        # A chunked body would reach the view still framed by the development server, or with no length behind
        # a production one: the room cannot be checked first, and the file could be stored wrong.
        raise serializers.ValidationError(
            {"file": ["Send the file with its size in Content-Length, not in chunks (Transfer-Encoding)."]}
        )
    return int(raw)


def _body(request: Request, size: int) -> Iterator[bytes]:
    """Yield the request body in chunks, never all of it at once; a body shorter than announced is refused."""
    received = 0
    while chunk := request.read(CHUNK):
        received += len(chunk)
        yield chunk
    if received < size:
        raise serializers.ValidationError(
            {"file": [f"The upload ended after {received} of {size} bytes; nothing was written."]}
        )


class VolumeEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]  # mypy cannot check bases unpacked from a tuple
    """A tenant's volumes that you can see: your home, your projects' volumes and datasets (tenant admins: all).

    Tenant admins create, change and delete project volumes and datasets;
    `POST volumes/home/` returns your own home, made on first use.
    """

    serializer_class = s.VolumeSerializer
    filterset_class = VolumeFilter
    ordering_fields = ["kind", "name", "used_bytes", "created_at"]
    search_fields = ["name", "description"]
    action_roles = {"home": Role.MEMBER}

    def scoped_queryset(self) -> QuerySet[Volume]:
        return visible_volumes(self.actor, self.tenant)

    def get_serializer(self, *args: Any, **kwargs: Any) -> Any:
        # Your rights on every volume being rendered, in two queries for the whole page.
        serializer = super().get_serializer(*args, **kwargs)
        if args and args[0] is not None:
            rows = [args[0]] if isinstance(args[0], Volume) else list(args[0])
            serializer.context["rights"] = rights_by_volume(self.actor, self.tenant, rows)
        return serializer

    def _fresh(self, volume: Volume) -> Volume:
        return self.get_queryset().get(pk=volume.pk)

    @extend_schema(request=s.VolumeCreateSerializer, responses={201: s.VolumeSerializer})
    def create(self, request: Request, tenant: str) -> Response:
        data = self.validated_input(s.VolumeCreateSerializer)
        volume = volumes.create_volume(actor=self.actor, tenant=self.tenant, **data)
        return self.respond(self._fresh(volume), status.HTTP_201_CREATED)

    @extend_schema(request=s.VolumeUpdateSerializer, responses=s.VolumeSerializer)
    def partial_update(self, request: Request, tenant: str, pk: str) -> Response:
        data = self.validated_input(s.VolumeUpdateSerializer, partial=True)
        volume = volumes.update_volume(actor=self.actor, volume=self.get_object(), **data)
        return self.respond(self._fresh(volume))

    def destroy(self, request: Request, tenant: str, pk: str) -> Response:
        """Delete an empty project volume or dataset (409 while it holds files, and for a home)."""
        with _file_errors():
            volumes.delete_volume(actor=self.actor, volume=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={200: s.VolumeSerializer})
    @action(detail=False, methods=["post"])
    def home(self, request: Request, tenant: str) -> Response:
        """Return your home in this tenant (mounted at /home/<you>), making it on first use."""
        if self.actor.user is None:
            raise exceptions.NotFound()
        return self.respond(self._fresh(volumes.home_volume(tenant=self.tenant, user=self.actor.user)))


class _OfVolume:
    """Endpoints below one volume (`volumes/<volume>/...`): the volume, when the caller can see it, else 404."""

    actor: Any
    tenant: Any
    kwargs: dict[str, Any]

    def volume(self) -> Volume:
        return get_object_or_404(visible_volumes(self.actor, self.tenant), pk=self.kwargs["volume"])


class VolumeShareEndpoint(_OfVolume, *_READ, TenantViewSet):  # type: ignore[misc]  # bases unpacked from a tuple
    """The projects a volume is shared with (by project slug); tenant admins share and unshare."""

    serializer_class = s.VolumeShareSerializer
    lookup_field = "project__slug"
    lookup_url_kwarg = "project"
    lookup_value_regex = SLUG_PATTERN
    pagination_class = None  # a volume is shared with a few projects at most

    def scoped_queryset(self) -> QuerySet[VolumeShare]:
        return VolumeShare.objects.filter(volume=self.volume()).select_related("project")

    @extend_schema(request=s.VolumeShareCreateSerializer, responses={201: s.VolumeShareSerializer})
    def create(self, request: Request, tenant: str, volume: str) -> Response:
        """Share the volume with a project (again: change `read_only`); datasets only read-only."""
        data = self.validated_input(s.VolumeShareCreateSerializer)
        share = volumes.share_volume(actor=self.actor, volume=self.volume(), **data)
        return self.respond(share, status.HTTP_201_CREATED)

    def destroy(self, request: Request, tenant: str, volume: str, project: str) -> Response:
        """Stop sharing the volume with the project; running workloads keep their mount."""
        found = get_object_or_404(projects_in_scope(), slug=project)
        volumes.unshare_volume(actor=self.actor, volume=self.volume(), project=found)
        return Response(status=status.HTTP_204_NO_CONTENT)


class VolumeFileEndpoint(TenantViewSet):
    """The files of one volume, by `?path=`: list a folder, download, upload, make folders, delete.

    Reading needs read rights on the volume, writing write rights (members
    of its project, tenant admins; never viewers, never through a read-only
    share). A path that climbs out (`..`), is absolute or leads through a
    symlink is a 400 naming `path`; nothing is read or written for it.
    """

    queryset = Volume.all_tenants.none()  # names the model for the schema; requests read `scoped_queryset`
    schema = SingleObjectSchema()  # the listing is one object (a page of one folder), not a page of volumes
    serializer_class = s.FileListingSerializer
    lookup_url_kwarg = "volume"
    write_role = Role.MEMBER
    pagination_class = None
    filter_backends: list[Any] = []

    def scoped_queryset(self) -> QuerySet[Volume]:
        return visible_volumes(self.actor, self.tenant)

    def _query(self, serializer_class: type[serializers.Serializer]) -> dict[str, Any]:
        query = serializer_class(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        return dict(query.validated_data)

    @extend_schema(parameters=[s.FileQuerySerializer], responses=s.FileListingSerializer)
    def list(self, request: Request, tenant: str, volume: str) -> Response:
        """One page of a folder's entries, sorted by name: ask again with `offset` + `limit` while `more`."""
        query = self._query(s.FileQuerySerializer)
        path, limit, offset = query["path"], query["limit"], query["offset"]
        with _file_errors():
            found = volume_files.list_files(
                actor=self.actor, volume=self.get_object(), path=path, limit=limit + 1, offset=offset
            )
        listing = {
            "path": path,
            "offset": offset,
            "limit": limit,
            "more": len(found) > limit,
            "entries": [s.entry_row(path, entry) for entry in found[:limit]],
        }
        return Response(s.FileListingSerializer(listing).data)

    @extend_schema(parameters=[s.FilePathSerializer], responses=s.DeletedSerializer)
    def remove(self, request: Request, tenant: str, volume: str) -> Response:
        """Delete a file, a link (never its target) or a folder with everything in it."""
        path = self._query(s.FilePathSerializer)["path"]
        with _file_errors():
            freed = volume_files.delete_path(actor=self.actor, volume=self.get_object(), path=path)
        return Response(s.DeletedSerializer({"path": path, "freed_bytes": freed}).data)

    @extend_schema(
        parameters=[s.FilePathSerializer], responses={(200, "application/octet-stream"): OpenApiTypes.BINARY}
    )
    @action(detail=False, methods=["get"], renderer_classes=[renderers.JSONRenderer, _BinaryRenderer])
    def content(self, request: Request, tenant: str, volume: str) -> FileResponse:
        """Download a file: its bytes, streamed, as an attachment."""
        path = self._query(s.FilePathSerializer)["path"]
        with _file_errors():
            opened, _ = volume_files.open_file(actor=self.actor, volume=self.get_object(), path=path)
        name = posixpath.basename(path.rstrip("/")) or "download"
        return file_download(request._request, opened, filename=name, chunk=CHUNK)

    @extend_schema(
        parameters=[s.FilePathSerializer],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={200: s.UploadedSerializer},
    )
    @content.mapping.put
    def upload(self, request: Request, tenant: str, volume: str) -> Response:
        """Upload a file (replacing one there) from the raw body; 413 naming `file` when over the room left."""
        path = self._query(s.FilePathSerializer)["path"]
        size = _content_length(request)
        target = self.get_object()
        try:
            with _file_errors():
                written = volume_files.upload_file(
                    actor=self.actor, volume=target, path=path, chunks=_body(request, size), size=size
                )
        except volume_files.FileTooLarge as error:
            return _too_large(error)
        return Response(s.UploadedSerializer({"path": path, "size": written}).data)

    @extend_schema(request=s.FilePathSerializer, responses={201: s.FilePathSerializer})
    @action(detail=False, methods=["post"])
    def folders(self, request: Request, tenant: str, volume: str) -> Response:
        """Make a folder, and the folders above it that are missing (409 when it exists)."""
        path = self.validated_input(s.FilePathSerializer)["path"]
        with _file_errors():
            volume_files.make_folder(actor=self.actor, volume=self.get_object(), path=path)
        return Response({"path": path}, status=status.HTTP_201_CREATED)


class StorageBackendEndpoint(*_READ, PlatformViewSet):  # type: ignore[misc]  # bases unpacked from a tuple
    """Where volumes live: directory trees hosts mount (operators only). Only an empty backend can go."""

    serializer_class = s.StorageBackendSerializer
    lookup_field = "name"
    lookup_value_regex = SLUG_PATTERN
    read_role = Role.OPERATOR

    def scoped_queryset(self) -> QuerySet[StorageBackend]:
        return StorageBackend.objects.select_related("node").prefetch_related("pools")

    @extend_schema(request=s.StorageBackendCreateSerializer, responses={201: s.StorageBackendSerializer})
    def create(self, request: Request) -> Response:
        data = self.validated_input(s.StorageBackendCreateSerializer)
        backend = storage.create_storage_backend(actor=self.actor, **data)
        return self.respond(self.get_queryset().get(pk=backend.pk), status.HTTP_201_CREATED)

    def destroy(self, request: Request, name: str) -> Response:
        storage.delete_storage_backend(actor=self.actor, backend=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
