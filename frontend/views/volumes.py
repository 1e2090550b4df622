"""The tenant's Storage page (volumes, quotas, sharing) and each volume's file browser.

Who sees which volume and may change its files is
`inventory.services.volume_access`'s; the writes are `volumes`' and
`volume_files`' services, whose errors land on the form that caused them
(nothing is written on an error). Uploads arrive as multipart forms whose
body is read as it arrives (a streamed route): `frontend.uploads.RoomLimit`
stops one as soon as it passes the volume's room, so Django spools at most
the room (to a temporary file past 2.5 MB); the file then streams into the
volume in chunks, so memory stays flat however large it is.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.csrf import csrf_exempt, csrf_protect

from common.downloads import file_download
from common.errors import Conflict
from frontend.access import Page, tenant_view
from frontend.forms import (
    GIB,
    FolderForm,
    ProjectStorageForm,
    ShareForm,
    TenantStorageForm,
    UploadForm,
    VolumeEditForm,
    VolumeForm,
    apply_service_errors,
    gib_to_bytes,
)
from frontend.uploads import RoomLimit
from inventory.choices import VolumeKind
from inventory.models import Volume
from inventory.selectors import storage_use
from inventory.services import volume_access, volume_files, volumes
from inventory.services.volume_access import Rights, rights_by_volume, visible_volumes
from tenants import services as tenant_services
from tenants.choices import Role
from tenants.models import Project
from tenants.selectors import projects_in_scope

PAGE_SIZE = 200
CHUNK = 1 << 20


def _attempt(form: forms.Form, call: Callable[[], Any]) -> bool:
    """Run a service call for a valid form; on a refusal put its message on the form and return False."""
    try:
        call()
    except (ValidationError, Conflict) as error:
        apply_service_errors(form, error)
        return False
    except (volume_files.FileNotFound, volume_files.StorageUnavailable) as error:
        form.add_error(None, str(error))
        return False
    return True


def _projects() -> list[tuple[str, str]]:
    return [(p.slug, p.name) for p in projects_in_scope()]


# --- the Storage page -----------------------------------------------------------------


@tenant_view(Role.VIEWER)
def storage(request: HttpRequest, page: Page) -> HttpResponse:
    """The volumes you can see with their use, the tenant's and projects' quotas, and (admins) new volumes."""
    action = request.POST.get("action", "") if request.method == "POST" else ""
    if action == "home":
        if not page.can_write or page.actor.user is None:
            raise PermissionDenied("Viewers have no home: they never write.")
        home = volumes.home_volume(tenant=page.tenant, user=page.actor.user)
        return redirect("frontend:volume", tenant=page.tenant.slug, pk=home.pk)
    forms_ = _storage_forms(request, page, action)
    form = forms_.get(action)
    if form is not None and form.is_valid() and _attempt(form, lambda: SAVES[action](page, form)):
        messages.success(request, "Saved.")
        return redirect("frontend:storage", tenant=page.tenant.slug)
    return render(request, "frontend/volumes.html", {"page": page, **_storage_context(page), "forms": forms_})


def _storage_forms(request: HttpRequest, page: Page, action: str) -> dict[str, forms.Form]:
    """Return the Storage page's forms; only the one named by `action` is bound to the post."""

    def bound(name: str) -> Any:
        return request.POST if action == name else None

    tenant = page.tenant
    initial = {
        "storage_limit_bytes": _gib_of(tenant.storage_limit_bytes),
        "home_limit_bytes": _gib_of(tenant.home_limit_bytes),
    }
    return {
        "create": VolumeForm(bound("create"), prefix="new", project_choices=_projects()),
        "tenant_quota": TenantStorageForm(bound("tenant_quota"), prefix="tq", initial=initial),
        "project_quota": ProjectStorageForm(bound("project_quota"), prefix="pq", project_choices=_projects()),
    }


def _gib_of(size: int | None) -> Decimal | None:
    return None if size is None else Decimal(size) / GIB


def _create_volume(page: Page, form: forms.Form) -> Volume:
    data = form.cleaned_data
    project = get_object_or_404(projects_in_scope(), slug=data["project"]) if data["project"] else None
    return volumes.create_volume(
        actor=page.actor,
        tenant=page.tenant,
        kind=data["kind"],
        name=data["name"],
        project=project,
        description=data["description"],
        size_limit_bytes=gib_to_bytes(data["size_limit_bytes"]),
    )


def _set_tenant_quota(page: Page, form: forms.Form) -> Any:
    data = form.cleaned_data
    return tenant_services.update_tenant(
        actor=page.actor,
        tenant=page.tenant,
        storage_limit_bytes=gib_to_bytes(data["storage_limit_bytes"]),
        home_limit_bytes=gib_to_bytes(data["home_limit_bytes"]),
    )


def _set_project_quota(page: Page, form: forms.Form) -> Any:
    project = get_object_or_404(projects_in_scope(), slug=form.cleaned_data["project"])
    limit = gib_to_bytes(form.cleaned_data["storage_limit_bytes"])
    return tenant_services.update_project(actor=page.actor, project=project, storage_limit_bytes=limit)


SAVES: dict[str, Callable[[Page, Any], Any]] = {
    "create": _create_volume,
    "tenant_quota": _set_tenant_quota,
    "project_quota": _set_project_quota,
}


def _use(used: int, limit: int | None) -> dict[str, Any]:
    """Return a use figure for a bar: bytes used, the limit (None: none) and the percentage of it."""
    percent = min(100, round(100 * used / limit)) if limit else (100 if limit == 0 and used else 0)
    return {"used": used, "limit": limit, "percent": percent, "over": limit is not None and used > limit}


def _storage_context(page: Page) -> dict[str, Any]:
    shown = list(visible_volumes(page.actor, page.tenant))
    rights = rights_by_volume(page.actor, page.tenant, shown)
    use = storage_use(page.tenant.pk)
    projects = [(p, _use(use.of_project(p.pk), p.storage_limit_bytes)) for p in Project.objects.order_by("slug")]
    user = page.actor.user
    return {
        "rows": [
            (v, volume_access.mount_target(v), _use(v.used_bytes, v.size_limit_bytes), rights.get(v.pk)) for v in shown
        ],
        "tenant_use": _use(use.total, page.tenant.storage_limit_bytes),
        "project_use": projects,
        "has_home": user is not None and any(v.kind == VolumeKind.HOME and v.owner_id == user.pk for v in shown),
    }


# --- one volume: the file browser ------------------------------------------------------


def _visible(page: Page, pk: int) -> tuple[Volume, Rights]:
    volume = get_object_or_404(visible_volumes(page.actor, page.tenant), pk=pk)
    return volume, rights_by_volume(page.actor, page.tenant, [volume])[volume.pk]


def _folder(request: HttpRequest) -> str:
    return (request.POST.get("folder") if request.method == "POST" else request.GET.get("path")) or ""


def _page_number(request: HttpRequest) -> int:
    raw = request.GET.get("page", "1")
    return int(raw) if raw.isascii() and raw.isdigit() and 0 < int(raw) <= 10**6 else 1


# CSRF is checked inside (csrf_protect below): the middleware would read request.POST, parsing the upload with
# Django's handlers alone, before the view could put RoomLimit in front of them (Django's documented pattern).
@csrf_exempt
@tenant_view(Role.VIEWER)
def volume(request: HttpRequest, page: Page, pk: int) -> HttpResponse:
    """A volume's folder `?path=`, 200 entries a page; uploads, new folders, deletes; (admins) sharing and limits."""
    target, rights = _visible(page, pk)
    return _volume_page(request, page, target, rights, _limit_upload(request, target))


def _limit_upload(request: HttpRequest, target: Volume) -> RoomLimit | None:
    """Put a RoomLimit first among a multipart post's upload handlers; return it (None for other requests).

    The folder is the page's `?path=` (the form posts back to it): the post's own fields are not read yet.
    """
    if request.method != "POST" or request.content_type != "multipart/form-data":
        return None
    limit = RoomLimit(request, target, request.GET.get("path", ""))
    request.upload_handlers = [limit, *request.upload_handlers]
    return limit


@csrf_protect
def _volume_page(
    request: HttpRequest, page: Page, target: Volume, rights: Rights, limit: RoomLimit | None
) -> HttpResponse:
    folder = _folder(request)
    action = request.POST.get("action", "") if request.method == "POST" else ""
    if limit is not None and limit.refused is not None:
        return _refused_upload(request, page, target, rights, folder, limit.refused)
    forms_ = _volume_forms(request, target, action)
    if action in forms_ and forms_[action].is_valid():
        if _attempt(forms_[action], lambda: FILE_ACTIONS[action](page, target, folder, forms_[action])):
            messages.success(request, DONE[action])
            return _back(page, target, folder if action != "delete_volume" else None)
    elif action and action not in forms_:
        return HttpResponse("No such action.", status=400)
    return render(request, "frontend/volume.html", _volume_context(request, page, target, rights, folder, forms_))


def _refused_upload(
    request: HttpRequest, page: Page, target: Volume, rights: Rights, folder: str, refused: ValidationError
) -> HttpResponse:
    """The page with the upload form showing why RoomLimit stopped the upload (nothing was written)."""
    forms_ = _volume_forms(request, target, "upload")
    upload = forms_["upload"]
    upload.is_valid()  # binds it; its own complaint (no file arrived) gives way to the real reason
    upload.errors.clear()
    apply_service_errors(upload, refused)
    return render(request, "frontend/volume.html", _volume_context(request, page, target, rights, folder, forms_))


def _volume_forms(request: HttpRequest, target: Volume, action: str) -> dict[str, forms.Form]:
    def bound(name: str) -> Any:
        return request.POST if action == name else None

    others = [(slug, name) for slug, name in _projects() if slug != (target.project.slug if target.project else "")]
    edit_initial = {"description": target.description, "size_limit_bytes": _gib_of(target.size_limit_bytes)}
    return {
        "upload": UploadForm(bound("upload"), request.FILES if action == "upload" else None, prefix="up"),
        "folder": FolderForm(bound("folder"), prefix="dir"),
        "delete": _PathForm(bound("delete")),
        "share": ShareForm(bound("share"), prefix="share", project_choices=others),
        "unshare": ShareForm(bound("unshare"), prefix="unshare", project_choices=_projects()),
        "edit": VolumeEditForm(bound("edit"), prefix="edit", initial=edit_initial),
        "delete_volume": forms.Form(bound("delete_volume")),
    }


class _PathForm(forms.Form):
    path = forms.CharField(max_length=4096, strip=False)


def _upload(page: Page, target: Volume, folder: str, form: forms.Form) -> int:
    uploaded = form.cleaned_data["file"]
    path = posixpath.join(folder, uploaded.name) if folder.strip("/") else uploaded.name
    try:
        return volume_files.upload_file(
            actor=page.actor, volume=target, path=path, chunks=uploaded.chunks(CHUNK), size=uploaded.size
        )
    except ValidationError as error:
        if hasattr(error, "error_dict") and "path" in error.error_dict:  # the form has no path: it is the file's
            raise ValidationError({"file": error.error_dict["path"]}) from error
        raise


def _make_folder(page: Page, target: Volume, folder: str, form: forms.Form) -> None:
    path = posixpath.join(folder, form.cleaned_data["path"]) if folder.strip("/") else form.cleaned_data["path"]
    volume_files.make_folder(actor=page.actor, volume=target, path=path)


def _delete(page: Page, target: Volume, folder: str, form: forms.Form) -> int:
    return volume_files.delete_path(actor=page.actor, volume=target, path=form.cleaned_data["path"])


def _share(page: Page, target: Volume, folder: str, form: forms.Form) -> Any:
    project = get_object_or_404(projects_in_scope(), slug=form.cleaned_data["project"])
    return volumes.share_volume(
        actor=page.actor, volume=target, project=project, read_only=form.cleaned_data["read_only"]
    )


def _unshare(page: Page, target: Volume, folder: str, form: forms.Form) -> None:
    project = get_object_or_404(projects_in_scope(), slug=form.cleaned_data["project"])
    volumes.unshare_volume(actor=page.actor, volume=target, project=project)


def _edit(page: Page, target: Volume, folder: str, form: forms.Form) -> Volume:
    data = form.cleaned_data
    return volumes.update_volume(
        actor=page.actor,
        volume=target,
        description=data["description"],
        size_limit_bytes=gib_to_bytes(data["size_limit_bytes"]),
    )


def _delete_volume(page: Page, target: Volume, folder: str, form: forms.Form) -> None:
    volumes.delete_volume(actor=page.actor, volume=target)


FILE_ACTIONS: dict[str, Callable[[Page, Volume, str, Any], Any]] = {
    "upload": _upload,
    "folder": _make_folder,
    "delete": _delete,
    "share": _share,
    "unshare": _unshare,
    "edit": _edit,
    "delete_volume": _delete_volume,
}
DONE = {
    "upload": "Uploaded.",
    "folder": "Folder made.",
    "delete": "Deleted.",
    "share": "Shared.",
    "unshare": "No longer shared.",
    "edit": "Saved.",
    "delete_volume": "Volume deleted.",
}


def _back(page: Page, target: Volume, folder: str | None) -> HttpResponse:
    if folder is None:
        return redirect("frontend:storage", tenant=page.tenant.slug)
    url = reverse("frontend:volume", kwargs={"tenant": page.tenant.slug, "pk": target.pk})
    return redirect(f"{url}?{urlencode({'path': folder})}" if folder else url)


def _crumbs(folder: str) -> list[tuple[str, str]]:
    parts = [part for part in folder.split("/") if part and part != "."]
    return [(part, "/".join(parts[: i + 1])) for i, part in enumerate(parts)]


def _volume_context(
    request: HttpRequest, page: Page, target: Volume, rights: Rights, folder: str, forms_: dict[str, forms.Form]
) -> dict[str, Any]:
    number = _page_number(request)
    entries: list[Any] = []
    error = ""
    if rights.read:
        try:
            entries = volume_files.list_files(
                actor=page.actor, volume=target, path=folder, limit=PAGE_SIZE + 1, offset=(number - 1) * PAGE_SIZE
            )
        except (ValidationError, Conflict, volume_files.FileNotFound, volume_files.StorageUnavailable) as refused:
            error = " ".join(refused.messages) if isinstance(refused, ValidationError) else str(refused)
    rows = [
        (entry, posixpath.join(folder, entry.name) if folder.strip("/") else entry.name,
         datetime.fromtimestamp(entry.modified, tz=UTC))
        for entry in entries[:PAGE_SIZE]
    ]  # fmt: skip
    failed = next((form for form in forms_.values() if form.is_bound and form.errors), None)
    return {
        "page": page,
        "volume": target,
        "failed": failed,
        "rights": rights,
        "mount_path": volume_access.mount_target(target),
        "use": _use(target.used_bytes, target.size_limit_bytes),
        "room": volume_files.room_for(target) if rights.write else None,
        "folder": folder,
        "crumbs": _crumbs(folder),
        "rows": rows,
        "error": error,
        "number": number,
        "more": len(entries) > PAGE_SIZE,
        "forms": forms_,
    }


@tenant_view(Role.VIEWER)
def download(request: HttpRequest, page: Page, pk: int) -> HttpResponse:
    """A file of the volume, `?path=`, streamed as an attachment."""
    target, _ = _visible(page, pk)
    path = request.GET.get("path", "")
    try:
        opened, _ = volume_files.open_file(actor=page.actor, volume=target, path=path)
    except ValidationError as refused:
        return HttpResponse(" ".join(refused.messages), status=400, content_type="text/plain; charset=utf-8")
    except volume_files.StorageUnavailable as refused:
        return HttpResponse(str(refused), status=503, content_type="text/plain; charset=utf-8")
    name = posixpath.basename(path.rstrip("/")) or "download"
    return file_download(request, opened, filename=name, chunk=CHUNK)  # type: ignore[return-value]  # tenant_view types pages as HttpResponse; Django streams this alike
