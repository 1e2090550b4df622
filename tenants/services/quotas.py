"""GPU quotas per (tenant, pool), set by operators, and per (project, pool), set by tenant admins.

The rules, each reported on the field it concerns:
- every number is within its range (no negative or absurd values);
- limit >= guaranteed; a limit of None (or NO_LIMIT) means no limit at this
  level, and is the default;
- a project's quota needs a tenant quota in the same pool, its limit is at
  most the tenant's limit and its count limits are at most the tenant's;
- lowering a tenant's limits below a project's is refused;
- a pool dedicated to one tenant takes no quota of another.
Guarantees may oversubscribe what backs them (the tenants' a pool's GPUs,
the projects' their tenant's guarantee): that is the holder's choice to
make, not a rule, and `tenants.selectors.oversubscribed_guarantees` says where
and by how much. Every check runs before anything is written, under a lock
on the tenant's quota row so that concurrent edits see each other, and one
ValidationError names every field that breaks a rule (a field already out of
range is not judged again against the other quotas).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from common.errors import FieldErrors, add_errors, gather, invalid, raise_errors
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import (
    MAX_COUNT,
    MAX_GPUS,
    MAX_RUNTIME_SECONDS,
    MAX_WEIGHT,
    NO_LIMIT,
    Project,
    ProjectQuota,
    Tenant,
    TenantQuota,
)
from tenants.scoping import tenant_scope
from tenants.services.access import require_operator, require_role
from tenants.services.audit import JsonDict, delete_audited, record_audit_event, update_audited

COUNT_FIELDS = ("max_notebooks_per_user", "max_pending_workloads", "max_runtime_seconds")


@dataclass(frozen=True)
class QuotaValues:
    """The numbers of one quota. Count limits of None mean "no limit at this level"."""

    guaranteed: int = 0
    limit: int = NO_LIMIT
    weight: int = 1
    max_notebooks_per_user: int | None = None
    max_pending_workloads: int | None = None
    max_runtime_seconds: int | None = None

    @classmethod
    def of(cls, quota: TenantQuota | ProjectQuota) -> QuotaValues:
        return cls(**{f.name: getattr(quota, f.name) for f in fields(cls)})

    def merged(self, changes: dict[str, Any]) -> QuotaValues:
        """Return a copy with `changes` applied (unknown keys are ignored; a `limit` of None is NO_LIMIT)."""
        known = {f.name for f in fields(self)}
        applied = {k: v for k, v in changes.items() if k in known}
        if "limit" in applied and applied["limit"] is None:
            applied["limit"] = NO_LIMIT
        return replace(self, **applied)


_RANGES: dict[str, tuple[int, int]] = {
    "guaranteed": (0, MAX_GPUS),
    "limit": (0, MAX_GPUS),
    "weight": (0, MAX_WEIGHT),
    "max_notebooks_per_user": (0, MAX_COUNT),
    "max_pending_workloads": (0, MAX_COUNT),
    "max_runtime_seconds": (60, MAX_RUNTIME_SECONDS),
}


def _range_errors(values: QuotaValues) -> FieldErrors:
    errors: FieldErrors = {}
    for name, (low, high) in _RANGES.items():
        value = getattr(values, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            errors[name] = [ValidationError("Must be a whole number.", code="invalid")]
        elif not low <= value <= high:
            errors[name] = [ValidationError(f"Must be between {low} and {high}.", code="out_of_range")]
    if "limit" not in errors and "guaranteed" not in errors and values.limit < values.guaranteed:
        add_errors(
            errors,
            invalid(
                "limit",
                "limit_below_guaranteed",
                f"The limit ({values.limit}) must be at least the guarantee ({values.guaranteed}).",
            ),
        )
    return errors


def quota_errors(values: Mapping[str, Any]) -> FieldErrors:
    """Return the rules the quota numbers given in `values` break on their own, by field.

    For an interface that refused other fields (a pool that is not there):
    the rules against other quotas need the pool, and the services add them.
    """
    given = {name: value for name, value in values.items() if name in _RANGES}
    errors = _range_errors(QuotaValues().merged(given))
    return {name: found for name, found in errors.items() if name in given}


def _check_pool_open_to(tenant: Tenant, pool: Any) -> None:
    if pool.dedicated_tenant_id is not None and pool.dedicated_tenant_id != tenant.pk:
        raise invalid("pool", "pool_dedicated", f"Pool {pool.name} is dedicated to another tenant.")


def _project_quotas(tenant: Tenant, pool_id: int) -> list[ProjectQuota]:
    with tenant_scope(tenant):
        return list(ProjectQuota.objects.filter(pool_id=pool_id))


def _tenant_covers_projects(tenant: Tenant, pool_id: int, values: QuotaValues, errors: FieldErrors) -> None:
    """Add to `errors` each number of `values` that falls below a project quota's in the same pool."""
    projects = _project_quotas(tenant, pool_id)
    highest = max((q.limit for q in projects if q.has_limit), default=0)
    if "limit" not in errors and values.limit < highest:
        add_errors(
            errors,
            invalid(
                "limit", "below_project_limit", f"A project in this pool has a limit of {highest}; lower it first."
            ),
        )
    for name in COUNT_FIELDS:
        cap = getattr(values, name)
        if name in errors or cap is None:
            continue
        if any(getattr(q, name) is not None and getattr(q, name) > cap for q in projects):
            add_errors(
                errors,
                invalid(name, "below_project_limit", f"A project in this pool has a higher {name}; lower it first."),
            )


def _project_within_tenant(tenant_quota: TenantQuota, values: QuotaValues, errors: FieldErrors) -> None:
    """Add to `errors` each number of `values` above its tenant quota's (fields already in error are skipped)."""
    if "limit" not in errors and values.limit != NO_LIMIT and values.limit > tenant_quota.limit:
        add_errors(
            errors,
            invalid(
                "limit",
                "above_tenant_limit",
                f"The limit ({values.limit}) exceeds the tenant's limit of {tenant_quota.limit} GPUs; "
                "leave it empty for no limit of the project's own.",
            ),
        )
    for name in COUNT_FIELDS:
        cap, value = getattr(tenant_quota, name), getattr(values, name)
        if name not in errors and cap is not None and value is not None and value > cap:
            add_errors(errors, invalid(name, "above_tenant_limit", f"{name} ({value}) exceeds the tenant's {cap}."))


def _locked_tenant_quota(tenant: Tenant, pool_id: int) -> TenantQuota | None:
    with tenant_scope(tenant):
        return (
            TenantQuota.objects.select_for_update(of=("self",)).select_related("tenant").filter(pool_id=pool_id).first()
        )


def _quota_snapshot(quota: TenantQuota | ProjectQuota) -> JsonDict:
    # Names, not ids: the audit log shows these as they were when the change was made.
    data: JsonDict = {"pool": quota.pool.name, **asdict(QuotaValues.of(quota))}
    if isinstance(quota, ProjectQuota):
        data["project"] = quota.project.slug
    return data


@transaction.atomic
def create_tenant_quota(*, actor: Actor, tenant: Tenant, pool: Any, values: QuotaValues) -> TenantQuota:
    """Give `tenant` a quota in `pool`; operators only. Raises ValidationError naming the broken rule."""
    require_operator(actor)
    errors = _range_errors(values)
    gather(errors, lambda: _check_pool_open_to(tenant, pool))
    if "pool" not in errors and _locked_tenant_quota(tenant, pool.pk) is not None:
        add_errors(
            errors, invalid("pool", "unique", f"The tenant already has a quota in pool {pool.name}; change that one.")
        )
    raise_errors(errors)
    with tenant_scope(tenant):
        quota = TenantQuota.objects.create(tenant=tenant, pool=pool, **asdict(values))
    record_audit_event(
        actor=actor, action="tenant_quota.create", obj=quota, tenant_id=tenant.pk, after=_quota_snapshot(quota)
    )
    return quota


@transaction.atomic
def update_tenant_quota(*, actor: Actor, quota: TenantQuota, changes: dict[str, Any]) -> TenantQuota:
    """Change a tenant quota's numbers; operators only (a tenant admin never changes its own tenant's quota)."""
    require_operator(actor)
    locked = _locked_tenant_quota(quota.tenant, quota.pool_id)
    if locked is None:
        raise TenantQuota.DoesNotExist()
    values = QuotaValues.of(locked).merged(changes)
    errors = _range_errors(values)
    _tenant_covers_projects(locked.tenant, locked.pool_id, values, errors)
    raise_errors(errors)
    return update_audited(
        actor=actor,
        action="tenant_quota.update",
        obj=locked,
        changes=asdict(values),
        tenant_id=locked.tenant_id,
        audited=_quota_snapshot,
    )


@transaction.atomic
def delete_tenant_quota(*, actor: Actor, quota: TenantQuota) -> None:
    """Remove a tenant quota and, with it, its projects' quotas in that pool; operators only."""
    require_operator(actor)
    with tenant_scope(quota.tenant):
        ProjectQuota.objects.filter(pool_id=quota.pool_id).delete()
    delete_audited(
        actor=actor, action="tenant_quota.delete", obj=quota, tenant_id=quota.tenant_id, audited=_quota_snapshot
    )


def _project_has_quota(project: Project, pool: Any) -> bool:
    with tenant_scope(project.tenant):
        return ProjectQuota.objects.filter(project=project, pool=pool).exists()


@transaction.atomic
def create_project_quota(*, actor: Actor, project: Project, pool: Any, values: QuotaValues) -> ProjectQuota:
    """Give `project` a share of its tenant's quota in `pool`; tenant admins and operators."""
    require_role(actor, project.tenant, Role.ADMIN)
    errors = _range_errors(values)
    tenant_quota = _locked_tenant_quota(project.tenant, pool.pk)
    if tenant_quota is None:
        message = f"The tenant has no quota in pool {pool.name}; ask an operator for one."
        add_errors(errors, invalid("pool", "no_tenant_quota", message))
    elif _project_has_quota(project, pool):
        message = f"The project already has a quota in pool {pool.name}; change that one."
        add_errors(errors, invalid("pool", "unique", message))
    if tenant_quota is not None:
        _project_within_tenant(tenant_quota, values, errors)
    raise_errors(errors)
    with tenant_scope(project.tenant):
        quota = ProjectQuota.objects.create(tenant_id=project.tenant_id, project=project, pool=pool, **asdict(values))
    record_audit_event(
        actor=actor, action="project_quota.create", obj=quota, tenant_id=project.tenant_id, after=_quota_snapshot(quota)
    )
    return quota


@transaction.atomic
def update_project_quota(*, actor: Actor, quota: ProjectQuota, changes: dict[str, Any]) -> ProjectQuota:
    """Change a project quota's numbers within the tenant's; tenant admins and operators."""
    require_role(actor, quota.project.tenant, Role.ADMIN)
    tenant_quota = _locked_tenant_quota(quota.project.tenant, quota.pool_id)
    with tenant_scope(quota.project.tenant):
        locked = ProjectQuota.objects.select_for_update(of=("self",)).select_related("project").get(pk=quota.pk)
    values = QuotaValues.of(locked).merged(changes)
    errors = _range_errors(values)
    if tenant_quota is None:
        add_errors(errors, invalid("pool", "no_tenant_quota", "The tenant no longer has a quota in this pool."))
    else:
        _project_within_tenant(tenant_quota, values, errors)
    raise_errors(errors)
    return update_audited(
        actor=actor,
        action="project_quota.update",
        obj=locked,
        changes=asdict(values),
        tenant_id=locked.tenant_id,
        audited=_quota_snapshot,
    )


@transaction.atomic
def delete_project_quota(*, actor: Actor, quota: ProjectQuota) -> None:
    """Remove a project's quota in one pool; tenant admins and operators."""
    require_role(actor, quota.project.tenant, Role.ADMIN)
    delete_audited(
        actor=actor, action="project_quota.delete", obj=quota, tenant_id=quota.tenant_id, audited=_quota_snapshot
    )
