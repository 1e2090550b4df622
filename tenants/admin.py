"""Django admin for operators.

Every change made here goes through the same services as the API and the
UI, so it is validated the same way and writes exactly one audit event.
Quotas, memberships and tokens are read-only here: their rules (sums of
guarantees, role bounds) are enforced by the console pages and the API.
The audit log can be read, never changed.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from common.errors import Conflict
from tenants import services
from tenants.context import Actor
from tenants.models import ApiToken, AuditEvent, Membership, Project, ProjectQuota, Tenant, TenantQuota
from tenants.scoping import TenantOwnedModel, tenant_scope

USER_FIELDS = ["username", "email", "first_name", "last_name", "is_active", "is_staff", "is_superuser"]


def actor_of(request: HttpRequest) -> Actor:
    return Actor(user=request.user)  # type: ignore[arg-type]


class OperatorAdmin(admin.ModelAdmin):
    """Admin pages open to operators (staff) only."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return self.has_module_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        # The services enforce rules a model form cannot see (quota in use,
        # dedication conflicts). Their error rolls the whole change back; show
        # it rather than a server error.
        try:
            with self._scope_of(kwargs.get("object_id") or (args[0] if args else None)):
                response = super().changeform_view(request, *args, **kwargs)
                # Render now, inside the scope: related tenant-owned rows (a membership's projects)
                # are read while the template renders, and the scope ends with this block.
                return response.render() if isinstance(response, TemplateResponse) else response
        except (ValidationError, Conflict) as error:
            text = "; ".join(error.messages) if isinstance(error, ValidationError) else error.message
            self.message_user(request, text, messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def _scope_of(self, object_id: str | None) -> AbstractContextManager[object]:
        """The tenant scope of the object a change page shows: an operator looking at one tenant's row sees
        its related rows of that same tenant (never another's); no scope for platform rows or an add page."""
        if object_id is None or not issubclass(self.model, TenantOwnedModel):
            return nullcontext()
        try:
            tenant_id = self.model.all_tenants.filter(pk=object_id).values_list("tenant_id", flat=True).first()
        except (ValueError, ValidationError):  # not an id at all: the admin answers that itself
            return nullcontext()
        tenant = Tenant.objects.filter(pk=tenant_id).first() if tenant_id is not None else None
        return tenant_scope(tenant) if tenant is not None else nullcontext()

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> HttpResponse:
        try:
            return super().delete_view(request, object_id, extra_context)
        except Conflict as error:
            self.message_user(request, error.message, messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        # One audited service call per object, never a bulk delete behind the audit log's back.
        for obj in queryset:
            self.delete_model(request, obj)


class ReadOnlyAdmin(OperatorAdmin):
    """Admin pages that show but never change."""

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Tenant)
class TenantAdmin(OperatorAdmin):
    list_display = ["slug", "name", "is_active", "created_at"]
    search_fields = ["slug", "name"]
    list_filter = ["is_active"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["slug", "created_at", "updated_at"] if obj else ["created_at", "updated_at"]

    def save_model(self, request: HttpRequest, obj: Tenant, form: ModelForm[Tenant], change: bool) -> None:
        if change:
            updated = services.update_tenant(
                actor=actor_of(request), tenant=obj, name=obj.name, description=obj.description, is_active=obj.is_active
            )
        else:
            updated = services.create_tenant(
                actor=actor_of(request), slug=obj.slug, name=obj.name, description=obj.description
            )
        obj.pk = updated.pk

    def delete_model(self, request: HttpRequest, obj: Tenant) -> None:
        services.delete_tenant(actor=actor_of(request), tenant=obj)


@admin.register(Project)
class ProjectAdmin(OperatorAdmin):
    list_display = ["slug", "name", "tenant", "created_at"]
    search_fields = ["slug", "name", "tenant__slug"]
    list_filter = ["tenant"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Project]:
        return Project.all_tenants.select_related("tenant")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["tenant", "slug", "created_at", "updated_at"] if obj else ["created_at", "updated_at"]

    def save_model(self, request: HttpRequest, obj: Project, form: ModelForm[Project], change: bool) -> None:
        if change:
            updated = services.update_project(
                actor=actor_of(request), project=obj, name=obj.name, description=obj.description
            )
        else:
            updated = services.create_project(
                actor=actor_of(request), tenant=obj.tenant, slug=obj.slug, name=obj.name, description=obj.description
            )
        obj.pk = updated.pk

    def delete_model(self, request: HttpRequest, obj: Project) -> None:
        services.delete_project(actor=actor_of(request), project=obj)


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "tenant__slug"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Membership]:
        return Membership.all_tenants.select_related("user", "tenant")


@admin.register(TenantQuota)
class TenantQuotaAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "pool", "guaranteed", "limit", "weight"]
    list_filter = ["pool"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[TenantQuota]:
        return TenantQuota.all_tenants.select_related("tenant", "pool")


@admin.register(ProjectQuota)
class ProjectQuotaAdmin(ReadOnlyAdmin):
    list_display = ["project", "tenant", "pool", "guaranteed", "limit", "weight"]
    list_filter = ["pool", "tenant"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[ProjectQuota]:
        return ProjectQuota.all_tenants.select_related("tenant", "project", "pool")


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = ["name", "user", "tenant", "role", "prefix", "expires_at", "last_used_at", "revoked_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["name", "prefix", "user__username"]
    exclude = ["digest"]
    actions = ["revoke"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApiToken]:
        return ApiToken.all_tenants.select_related("user", "tenant")

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            services.revoke_token(actor=actor_of(request), token=token)
        self.message_user(request, "Tokens revoked.", messages.SUCCESS)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # The revoke action changes state although the admin is otherwise read-only.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "actor_label", "via", "action", "object_type", "object_id", "tenant_id", "request_id"]
    list_filter = ["via", "object_type"]
    search_fields = ["action", "actor_label", "object_id", "request_id"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditEvent]:
        return AuditEvent.all_tenants.all()

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return {}


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class AuditedUserAdmin(UserAdmin):
    """Accounts, with every change audited: making someone an operator must leave a trace."""

    def save_model(self, request: HttpRequest, obj: User, form: Any, change: bool) -> None:
        before = services.snapshot(User.objects.get(pk=obj.pk), USER_FIELDS) if change else None
        super().save_model(request, obj, form, change)
        if not obj.is_active:
            services.request_work_sweep()  # a deactivated account's running work stops
        after = services.snapshot(obj, USER_FIELDS)
        if form.cleaned_data.get("password1") or form.cleaned_data.get("password"):
            after["password_changed"] = True
        services.record_audit_event(
            actor=actor_of(request),
            action="user.update" if change else "user.create",
            obj=obj,
            tenant_id=None,
            before=before,
            after=after,
        )

    def delete_model(self, request: HttpRequest, obj: User) -> None:
        services.record_audit_event(
            actor=actor_of(request),
            action="user.delete",
            obj=obj,
            tenant_id=None,
            before=services.snapshot(obj, USER_FIELDS),
        )
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        for user in queryset:
            self.delete_model(request, user)
