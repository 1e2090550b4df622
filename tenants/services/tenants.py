"""Tenants and projects."""

from __future__ import annotations

from enum import Enum
from typing import Any

from django.db import transaction
from django.db.models import ProtectedError

from common.errors import Conflict, FieldErrors, add_errors, gather, invalid, raise_errors
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Project, Tenant
from tenants.scoping import tenant_scope
from tenants.services.access import request_work_sweep, require_operator, require_role
from tenants.services.audit import delete_audited, record_audit_event, snapshot, update_audited
from tenants.services.validation import clean_fields

TENANT_FIELDS = ["slug", "name", "description", "is_active", "storage_limit_bytes", "home_limit_bytes"]
PROJECT_FIELDS = ["slug", "name", "description", "storage_limit_bytes"]


class Unchanged(Enum):
    """The default of an update argument whose None means something (a limit of None is no limit)."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED
Limit = int | None | Unchanged


def _given(**values: Any) -> dict[str, Any]:
    """Return the values given, the ones not None: what an update changes."""
    return {name: value for name, value in values.items() if value is not None}


def _limits(**values: Limit) -> dict[str, int | None]:
    """Return the limits given (None included: no limit), leaving out those left UNCHANGED."""
    return {name: value for name, value in values.items() if not isinstance(value, Unchanged)}


@transaction.atomic
def create_tenant(*, actor: Actor, slug: str, name: str, description: str = "") -> Tenant:
    """Create a tenant and return it; operators only.

    Raises one ValidationError naming every failing field (a malformed or taken slug, a bad name).
    """
    require_operator(actor)
    tenant = Tenant(slug=slug, name=name, description=description)
    errors: FieldErrors = {}
    gather(errors, lambda: clean_fields(tenant))
    if "slug" not in errors and Tenant.objects.filter(slug=slug).exists():
        add_errors(errors, invalid("slug", "unique", f"A tenant with slug {slug!r} already exists."))
    raise_errors(errors)
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
    storage_limit_bytes: Limit = UNCHANGED,
    home_limit_bytes: Limit = UNCHANGED,
) -> Tenant:
    """Change a tenant's name, description, active flag or storage quotas; operators only. The slug is permanent.

    `storage_limit_bytes` caps every volume of the tenant together,
    `home_limit_bytes` each member's home; None removes a limit. Raises
    ValidationError naming every failing field (a negative limit). Deactivating
    it stops its running work within a minute (`request_work_sweep`).
    """
    require_operator(actor)
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    limits = _limits(storage_limit_bytes=storage_limit_bytes, home_limit_bytes=home_limit_bytes)
    if is_active is False:
        request_work_sweep()  # a deactivated tenant's running work stops (jobs.services.revocation)
    return update_audited(
        actor=actor,
        action="tenant.update",
        obj=tenant,
        changes={**_given(name=name, description=description, is_active=is_active), **limits},
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


def _slug_taken(tenant: Tenant, slug: str) -> bool:
    with tenant_scope(tenant):
        return Project.objects.filter(slug=slug).exists()


@transaction.atomic
def create_project(*, actor: Actor, tenant: Tenant, slug: str, name: str, description: str = "") -> Project:
    """Create a project in `tenant`; tenant admins and operators.

    Raises one ValidationError naming every failing field (a malformed or taken slug, a bad name).
    """
    require_role(actor, tenant, Role.ADMIN)
    project = Project(tenant=tenant, slug=slug, name=name, description=description)
    errors: FieldErrors = {}
    gather(errors, lambda: clean_fields(project, exclude=["tenant"]))
    if "slug" not in errors and _slug_taken(tenant, slug):
        add_errors(errors, invalid("slug", "unique", f"Project {slug!r} already exists in this tenant."))
    raise_errors(errors)
    project.save()
    record_audit_event(
        actor=actor, action="project.create", obj=project, tenant_id=tenant.pk, after=snapshot(project, PROJECT_FIELDS)
    )
    return project


@transaction.atomic
def update_project(
    *,
    actor: Actor,
    project: Project,
    name: str | None = None,
    description: str | None = None,
    storage_limit_bytes: Limit = UNCHANGED,
) -> Project:
    """Change a project's name, description or storage quota; tenant admins and operators. The slug is permanent.

    `storage_limit_bytes` caps the project's volumes and datasets together,
    within the tenant's storage quota; None removes it. Raises
    ValidationError naming every failing field (negative, above the tenant's).
    """
    require_role(actor, project.tenant, Role.ADMIN)
    with tenant_scope(project.tenant):
        project = Project.objects.select_for_update().get(pk=project.pk)
    limits = _limits(storage_limit_bytes=storage_limit_bytes)
    tenant_limit = project.tenant.storage_limit_bytes
    limit = limits.get("storage_limit_bytes")
    if limit is not None and tenant_limit is not None and limit > tenant_limit:
        raise invalid(
            "storage_limit_bytes",
            "above_tenant_limit",
            f"The project's storage quota ({limit} bytes) exceeds the tenant's ({tenant_limit} bytes).",
        )
    return update_audited(
        actor=actor,
        action="project.update",
        obj=project,
        changes={**_given(name=name, description=description), **limits},
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
