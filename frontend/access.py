"""How every page decides who may see it: one decorator for tenant pages, one for operator pages.

A tenant page resolves the tenant from its URL, the viewer's role there
(through the same selector the API uses), answers 404 when the viewer has
no role (exactly as for a tenant that does not exist), 403 below the page's
minimum role, and runs the view inside the tenant's scope.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, Concatenate, ParamSpec

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse

from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Tenant
from tenants.scoping import tenant_scope
from tenants.selectors import role_in_tenant, tenant_by_slug

P = ParamSpec("P")


@dataclass(frozen=True)
class Page:
    """What a tenant page knows about where it is and who is looking."""

    tenant: Tenant
    role: Role
    actor: Actor

    @property
    def is_admin(self) -> bool:
        return self.role.at_least(Role.ADMIN)

    @property
    def is_operator(self) -> bool:
        return self.role == Role.OPERATOR

    @property
    def can_write(self) -> bool:
        return self.role.at_least(Role.MEMBER)


def actor_of(request: HttpRequest) -> Actor:
    """Return the actor behind a logged-in browser request."""
    return Actor(user=request.user)  # type: ignore[arg-type]


def tenant_view(
    minimum: Role,
) -> Callable[[Callable[Concatenate[HttpRequest, Page, P], HttpResponse]], Callable[..., HttpResponse]]:
    """Decorate a view of `/t/<tenant>/...` that needs at least `minimum` there; it receives a Page."""

    def decorate(view: Callable[Concatenate[HttpRequest, Page, P], HttpResponse]) -> Callable[..., HttpResponse]:
        @login_required
        @wraps(view)
        def wrapper(request: HttpRequest, tenant: str, *args: Any, **kwargs: Any) -> HttpResponse:
            found = tenant_by_slug(tenant)
            actor = actor_of(request)
            role = role_in_tenant(actor, found) if found is not None else None
            if found is None or role is None:
                raise Http404("No such tenant.")
            if not role.at_least(minimum):
                raise PermissionDenied(f"This page needs the {minimum.label.lower()} role.")
            with tenant_scope(found):
                return view(request, Page(tenant=found, role=role, actor=actor), *args, **kwargs)

        return wrapper

    return decorate


def operator_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Decorate a platform page for operators; everyone else gets 404, as if it did not exist."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not actor_of(request).is_operator:
            raise Http404("No such page.")
        return view(request, *args, **kwargs)

    return wrapper
