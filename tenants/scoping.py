"""Fail-closed tenant scoping.

The default manager of every tenant-owned model (`TenantScopedManager`)
refuses to build a queryset unless a tenant scope is active, and filters to
that tenant when one is. Code that must see every tenant (the controller,
operators' views, authentication) uses the model's `all_tenants` manager,
whose name makes the bypass visible in review.

The scope lives in a context variable, so it follows the request through
sync and async code and never leaks between concurrent requests. The request
middleware clears it when the request ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, NoReturn, TypeVar

from django.db import models

if TYPE_CHECKING:
    from tenants.models import Tenant

_active_tenant_id: ContextVar[int | None] = ContextVar("gpucloud_active_tenant_id", default=None)

M = TypeVar("M", bound=models.Model)


class TenantScopeError(RuntimeError):
    """A tenant-owned model was queried with no tenant scope active."""


def active_tenant_id() -> int | None:
    """Return the id of the tenant in scope, or None when no scope is active."""
    return _active_tenant_id.get()


def activate_tenant(tenant: Tenant) -> Token[int | None]:
    """Make `tenant` the active scope; return the token that `deactivate_tenant` takes."""
    return _active_tenant_id.set(tenant.pk)


def deactivate_tenant(token: Token[int | None] | None = None) -> None:
    """Restore the scope saved in `token`, or clear the scope when no token is given."""
    if token is None:
        _active_tenant_id.set(None)
    else:
        _active_tenant_id.reset(token)


@contextmanager
def tenant_scope(tenant: Tenant) -> Iterator[Tenant]:
    """Run the block with `tenant` as the active scope, restoring the previous one after."""
    token = activate_tenant(tenant)
    try:
        yield tenant
    finally:
        _active_tenant_id.reset(token)


@contextmanager
def tenant_id_scope(tenant_id: int) -> Iterator[int]:
    """Run the block with the tenant of id `tenant_id` as the active scope, restoring the previous one after;
    for code that holds a row's `tenant_id`, not the tenant."""
    token = _active_tenant_id.set(tenant_id)
    try:
        yield tenant_id
    finally:
        _active_tenant_id.reset(token)


def _refuse(model: type[models.Model]) -> TenantScopeError:
    name = model.__name__
    return TenantScopeError(
        f"{name}.objects was used with no tenant scope active; "
        f"activate one with tenant_scope() or use {name}.all_tenants deliberately."
    )


class UnscopedQuerySet(models.QuerySet[M]):
    """What a scoped manager hands out with no scope active: it builds, but never reads or writes.

    Evaluating it raises TenantScopeError. Used as a subquery it matches no
    row, because it carries an always-false condition. Introspection that
    only builds a query (django-filter, schema generation) keeps working.
    """

    def _fetch_all(self) -> None:
        raise _refuse(self.model)

    def _refused(self, *args: object, **kwargs: object) -> NoReturn:
        raise _refuse(self.model)

    count = exists = aggregate = update = delete = iterator = explain = _refused
    create = bulk_create = bulk_update = get_or_create = update_or_create = in_bulk = _refused


class TenantScopedManager(models.Manager[M]):
    """Default manager of tenant-owned models: filters to the active tenant, refuses without one."""

    def get_queryset(self) -> models.QuerySet[M]:
        tenant_id = _active_tenant_id.get()
        if tenant_id is None:
            return UnscopedQuerySet(self.model, using=self._db).filter(pk__in=[])
        return super().get_queryset().filter(tenant_id=tenant_id)


class TenantOwnedModel(models.Model):
    """Abstract base of every model that belongs to one tenant.

    `objects` is scoped and is the default manager, so related-object access
    and admin forms fail closed too; `all_tenants` is the named bypass.
    Django uses the base manager (unscoped) only for internal lookups such as
    following a foreign key from an object already loaded.
    """

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")

    all_tenants = models.Manager()
    objects = TenantScopedManager()

    class Meta:
        abstract = True
        default_manager_name = "objects"
        base_manager_name = "all_tenants"
