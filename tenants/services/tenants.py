"""Tenants and projects."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import ProtectedError

from common.errors import Conflict, invalid
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Project, Tenant
from tenants.services.access import require_operator, require_role
from tenants.services.audit import delete_audited, record_audit_event, snapshot, update_audited
from tenants.services.validation import clean_fields

TENANT_FIELDS = ["slug", "name", "description", "is_active"]
PROJECT_FIELDS = ["slug", "name", "description"]


def _given(**values: Any) -> dict[str, Any]:
    """Return the values given, the ones not None: what an update changes."""
    return {name: value for name, value in values.items() if value is not None}


@transaction.atomic
def create_tenant(*, actor: Actor, slug: str, name: str, description: str = "") -> Tenant:
    """Create a tenant and return it; operators only. Raises ValidationError on a taken or malformed slug."""
    require_operator(actor)
    tenant = Tenant(slug=slug, name=name, description=description)
    clean_fields(tenant)
    if Tenant.objects.filter(slug=slug).exists():
        raise invalid("slug", "unique", f"A tenant with slug {slug!r} already exists.")
    tenant.save()
    record_audit_event(
        actor=actor, action="tenant.create", obj=tenant, tenant_id=tenant.pk, after=snapshot(tenant, TENANT_FIELDS)
    )
    return tenant


@transaction.atomic
def update_tenant(
    *,
    actor: Actor,
    tenant: Tenant,
    name: str | None = None,
    description: str | None = None,
    is_active: bool | None = None,
) -> Tenant:
    """Change a tenant's name, description or active flag; operators only. The slug is permanent."""
    require_operator(actor)
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    return update_audited(
        actor=actor,
        action="tenant.update",
        obj=tenant,
        changes=_given(name=name, description=description, is_active=is_active),
        tenant_id=tenant.pk,
        audited=TENANT_FIELDS,
    )


@transaction.atomic
def delete_tenant(*, actor: Actor, tenant: Tenant) -> None:
    """Delete an empty tenant; operators only. Raises Conflict while it still has projects or dedicated pools."""
    require_operator(actor)
    before = snapshot(tenant, TENANT_FIELDS)
    tenant_id = tenant.pk
    record_audit_event(actor=actor, action="tenant.delete", obj=tenant, tenant_id=tenant_id, before=before)
    try:
        tenant.delete()
    except ProtectedError as error:
        raise Conflict(
            "Delete the tenant's projects and release its dedicated pools first.", code="tenant_not_empty"
        ) from error


@transaction.atomic
def create_project(*, actor: Actor, tenant: Tenant, slug: str, name: str, description: str = "") -> Project:
    """Create a project in `tenant`; tenant admins and operators. Raises ValidationError on a taken slug."""
    require_role(actor, tenant, Role.ADMIN)
    project = Project(tenant=tenant, slug=slug, name=name, description=description)
    clean_fields(project, exclude=["tenant"])
    if Project.all_tenants.filter(tenant=tenant, slug=slug).exists():
        raise invalid("slug", "unique", f"Project {slug!r} already exists in this tenant.")
    project.save()
    record_audit_event(
        actor=actor, action="project.create", obj=project, tenant_id=tenant.pk, after=snapshot(project, PROJECT_FIELDS)
    )
    return project


@transaction.atomic
def update_project(
    *, actor: Actor, project: Project, name: str | None = None, description: str | None = None
) -> Project:
    """Change a project's name or description; tenant admins and operators. The slug is permanent."""
    require_role(actor, project.tenant, Role.ADMIN)
    project = Project.all_tenants.select_for_update().get(pk=project.pk)
    return update_audited(
        actor=actor,
        action="project.update",
        obj=project,
        changes=_given(name=name, description=description),
        tenant_id=project.tenant_id,
        audited=PROJECT_FIELDS,
    )


@transaction.atomic
def delete_project(*, actor: Actor, project: Project) -> None:
    """Delete a project and its quotas; tenant admins and operators."""
    require_role(actor, project.tenant, Role.ADMIN)
    delete_audited(
        actor=actor, action="project.delete", obj=project, tenant_id=project.tenant_id, audited=PROJECT_FIELDS
    )
