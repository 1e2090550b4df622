"""Launch presets: a tenant admin's ready-made launches (image, kind, resources, idle timeout).

Everyone in the tenant lists them (`jobs.selectors.presets_for_tenant`);
submitting with `preset` fills in what the request leaves out
(`jobs.services.spec`). A preset holds to the rules a launch from it would
meet: an image the tenant may run (a notebook image for notebooks), a pool
the tenant may use and holds quota in, resources within the submission
ranges and the tenant's quota, an idle timeout for notebooks only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from common.errors import FieldErrors, gather, invalid, raise_errors
from common.protocol.messages import RESOURCE_FIELDS
from inventory.models import NodePool
from jobs.choices import WorkloadKind
from jobs.models import LaunchPreset
from jobs.services import images
from jobs.services.spec import FILLED_BY_PRESET, rule_errors
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Tenant, TenantQuota
from tenants.services.access import require_role
from tenants.services.audit import delete_audited, record_audit_event, snapshot, update_audited

# A preset's own fields: its name and description, what it fills in a submission, and what only a preset sets.
PRESET_FIELDS = ["name", "description", *FILLED_BY_PRESET, "idle_timeout_seconds"]
MAX_NAME_LENGTH = 63
MAX_DESCRIPTION_LENGTH = 200
_RESOURCES = ("gpus_per_replica", "replicas", *RESOURCE_FIELDS, "max_runtime_seconds")


@dataclass(frozen=True)
class PresetValues:
    """Everything a preset says; the defaults are a one-GPU notebook's."""

    name: str
    image: str
    pool: NodePool
    description: str = ""
    kind: str = WorkloadKind.NOTEBOOK
    command: list[str] | None = None
    gpus_per_replica: int = 1
    replicas: int = 1
    cpu_milli: int = 1000
    memory_mib: int = 4096
    shm_mib: int | None = None
    idle_timeout_seconds: int | None = None
    max_runtime_seconds: int | None = None


@transaction.atomic
def create_preset(*, actor: Actor, tenant: Tenant, values: PresetValues) -> LaunchPreset:
    """Create a launch preset in `tenant` and return it; tenant admins and operators.

    Raises Http404 (no role in the tenant), PermissionDenied, or ValidationError naming the field and rule.
    """
    require_role(actor, tenant, Role.ADMIN)
    _check(tenant, values)
    preset = LaunchPreset(tenant=tenant, **_model_fields(values))
    with _unique_name(preset.name):
        preset.save()
    record_audit_event(
        actor=actor, action="preset.create", obj=preset, tenant_id=tenant.pk, after=snapshot(preset, PRESET_FIELDS)
    )
    return preset


@transaction.atomic
def update_preset(*, actor: Actor, preset: LaunchPreset, changes: dict[str, Any]) -> LaunchPreset:
    """Change some fields of `preset` (names as in PresetValues) and return it; tenant admins and operators.

    The preset as a whole is checked again, so a change that makes it
    unlaunchable (a job kind with an idle timeout, say) is refused. Raises as
    `create_preset` does.
    """
    tenant = preset.tenant
    require_role(actor, tenant, Role.ADMIN)
    preset = LaunchPreset.all_tenants.select_for_update(of=("self",)).select_related("pool").get(pk=preset.pk)
    unknown = sorted(set(changes) - {f.name for f in fields(PresetValues)})
    raise_errors({name: [ValidationError("Not a field of a launch preset.", code="unknown_field")] for name in unknown})
    values = replace(_values_of(preset), **changes)
    _check(tenant, values)
    with _unique_name(values.name):
        return update_audited(
            actor=actor,
            action="preset.update",
            obj=preset,
            changes={name: value for name, value in _model_fields(values).items() if name in changes},
            tenant_id=tenant.pk,
            audited=PRESET_FIELDS,
        )


@transaction.atomic
def delete_preset(*, actor: Actor, preset: LaunchPreset) -> None:
    """Delete a launch preset; tenant admins and operators. Workloads launched from it keep running, unlinked."""
    require_role(actor, preset.tenant, Role.ADMIN)
    delete_audited(actor=actor, action="preset.delete", obj=preset, tenant_id=preset.tenant_id, audited=PRESET_FIELDS)


def _values_of(preset: LaunchPreset) -> PresetValues:
    return PresetValues(**{f.name: getattr(preset, f.name) for f in fields(PresetValues)})


def _model_fields(values: PresetValues) -> dict[str, Any]:
    data = {f.name: getattr(values, f.name) for f in fields(PresetValues)}
    data["command"] = list(values.command or [])
    return data


@contextmanager
def _unique_name(name: str) -> Iterator[None]:
    """Run the block in a savepoint; raise ValidationError on `name` when its write meets a twin of that name."""
    try:
        # A savepoint: a concurrent twin makes the write fail without spoiling the caller's transaction.
        with transaction.atomic():
            yield
    except IntegrityError:
        raise invalid("name", "unique", f"A preset named {name!r} already exists in this tenant.") from None


def _check(tenant: Tenant, values: PresetValues) -> None:
    """Raise ValidationError naming every field of `values` that breaks its rule, all at once.

    The field rules are a submission's (`jobs.services.spec.rule_errors`);
    the rules that read the database run on the fields that passed them.
    """
    errors: FieldErrors = {}
    gather(errors, lambda: _check_name(values.name))
    gather(errors, lambda: _check_description(values.description))
    checked = {name: getattr(values, name) for name in ("kind", "image", *_RESOURCES, "idle_timeout_seconds")}
    for name, found in rule_errors({**checked, "command": list(values.command or [])}).items():
        errors.setdefault(name, []).extend(found)
    if not errors.keys() & {"kind", "image"}:
        gather(errors, lambda: _check_image_allowed(tenant, values))
    if not errors.keys() & {"pool", *_RESOURCES}:
        gather(errors, lambda: _check_pool(tenant, values))
    raise_errors(errors)


def _check_name(name: object) -> None:
    stripped = name.strip() if isinstance(name, str) else ""
    if not stripped or len(stripped) > MAX_NAME_LENGTH or not stripped.isprintable() or stripped != name:
        raise invalid(
            "name", "invalid_name", f"Give 1 to {MAX_NAME_LENGTH} printable characters, no leading or trailing space."
        )


def _check_description(description: object) -> None:
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_LENGTH:
        raise invalid("description", "too_long", f"At most {MAX_DESCRIPTION_LENGTH} characters.")


def _check_image_allowed(tenant: Tenant, values: PresetValues) -> None:
    images.check_image_allowed(images.policy_for_tenant(tenant.pk), values.image, values.kind)


def _check_pool(tenant: Tenant, values: PresetValues) -> None:
    """The pool must be open to the tenant and hold its quota; the launch must fit that quota."""
    pool = values.pool
    if not isinstance(pool, NodePool) or pool.dedicated_tenant_id not in (None, tenant.pk):
        raise invalid("pool", "does_not_exist", "No such pool for this tenant.")
    quota = TenantQuota.all_tenants.filter(tenant=tenant, pool=pool).first()
    if quota is None:
        raise invalid("pool", "no_quota", f"Tenant {tenant.slug} has no quota in pool {pool.name}.")
    gpus = values.gpus_per_replica * values.replicas
    if gpus > quota.limit:
        raise invalid(
            "gpus_per_replica",
            "above_quota_limit",
            f"{gpus} GPUs exceed the tenant's limit of {quota.limit} in pool {pool.name}.",
        )
    cap = quota.max_runtime_seconds
    if values.max_runtime_seconds is not None and cap is not None and values.max_runtime_seconds > cap:
        raise invalid(
            "max_runtime_seconds",
            "above_max_runtime",
            f"{values.max_runtime_seconds} s exceeds the maximum runtime of {cap} s in pool {pool.name}.",
        )
