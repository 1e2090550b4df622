"""The one base every API viewset inherits: authentication, tenant scope, roles, querysets.

Subclasses declare what they serve (`scoped_queryset`, serializers, the
roles each action needs) and cannot override how access is decided: the
methods in `_SEALED` may only be defined in this module, and defining one in
a subclass fails at import time.

Tenant endpoints live under `/api/v1/tenants/<tenant>/...`. The tenant comes
from the URL; a principal with no role there gets 404, exactly as if the
tenant did not exist, and objects of other tenants are never in the
queryset, so they answer 404 too. Platform endpoints (tenants, node pools,
tokens, the platform audit log) have no tenant in the URL.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import Token
from typing import Any, ClassVar, cast

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Model, QuerySet
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.viewsets import GenericViewSet

from common.api.types import accepted_values, type_errors
from common.errors import FieldErrors
from tenants.authentication import token_membership_role
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import ApiToken, Tenant
from tenants.scoping import activate_tenant, deactivate_tenant
from tenants.selectors import role_in_tenant, tenant_by_slug
from tenants.services.access import RequestRoleToken, forget_request_role, remember_request_role

_SEALED = (
    "initial",
    "dispatch",
    "finalize_response",
    "get_queryset",
    "get_permissions",
    "check_permissions",
    "check_object_permissions",
    "get_authenticators",
    "permission_classes",
    "authentication_classes",
)


def _schema_queryset(view: BaseViewSet) -> QuerySet[Any]:
    """Return an empty queryset of the endpoint's model, for OpenAPI schema generation only."""
    if view.queryset is not None:
        return view.queryset.none()
    model = cast(Any, view.get_serializer_class()).Meta.model
    return model._base_manager.none()


def _tenant_and_membership(actor: Actor, slug: str) -> tuple[Tenant | None, Role | None]:
    """Return the tenant named `slug` and the actor's membership role there when already known, else None.

    A token's tenant and the owner's role in it were read when the request
    authenticated; any other tenant (or actor) is read here.
    """
    token = actor.token
    if token is not None and token.tenant is not None and token.tenant.slug == slug:
        return token.tenant, token_membership_role(token)
    return tenant_by_slug(slug), None


def actor_of(request: Request) -> Actor:
    """Return the Actor behind an authenticated DRF request."""
    token = request.auth if isinstance(request.auth, ApiToken) else None
    return Actor(user=request.user if request.user.is_authenticated else None, token=token)


ID_PATTERN = r"[0-9]{1,18}"


class BaseViewSet(GenericViewSet):
    """Common machinery. Use TenantViewSet or PlatformViewSet, never this directly."""

    read_role: ClassVar[Role] = Role.VIEWER
    write_role: ClassVar[Role] = Role.ADMIN
    action_roles: ClassVar[dict[str, Role]] = {}
    input_serializer_class: ClassVar[type[serializers.Serializer] | None] = None
    update_serializer_class: ClassVar[type[serializers.Serializer] | None] = None

    actor: Actor
    role: Role

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        endpoint = cls.__module__ != __name__  # not TenantViewSet or PlatformViewSet themselves
        if endpoint and getattr(cls, "lookup_field", "pk") in ("pk", "id") and "lookup_value_regex" not in cls.__dict__:
            # Ids are positive 64-bit integers: a longer or other path is no route (404), never a database error.
            setattr(cls, "lookup_value_regex", ID_PATTERN)  # noqa: B010  # read by DRF's router, declared by none
        if cls.__module__ != __name__:
            overridden = [name for name in _SEALED if name in cls.__dict__]
            if overridden:
                raise TypeError(
                    f"{cls.__name__} may not override {', '.join(overridden)}: access is decided by the base."
                )

    def scoped_queryset(self) -> QuerySet[Any]:
        """Return what this endpoint serves, read through scoped selectors. Subclasses implement it."""
        raise NotImplementedError

    def required_role(self) -> Role:
        """Return the role the current action needs."""
        if self.action in self.action_roles:
            return self.action_roles[self.action]
        return self.read_role if self.request.method in ("GET", "HEAD", "OPTIONS") else self.write_role

    def deny_unless_allowed(self) -> None:
        """Raise PermissionDenied when the actor's role is below what the current action needs."""
        needed = self.required_role()
        if not self.role.at_least(needed):
            raise exceptions.PermissionDenied(f"This needs the {needed.label.lower()} role.")

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        context["actor"] = getattr(self, "actor", None)
        context["tenant"] = getattr(self, "tenant", None)
        return context

    def validated_input(
        self,
        serializer_class: type[serializers.Serializer],
        *,
        partial: bool = False,
        rules: Callable[[dict[str, Any]], FieldErrors] | None = None,
    ) -> dict[str, Any]:
        """Validate the request body with `serializer_class` and return its data.

        Raises ValidationError naming every failing field at once: values of
        the wrong JSON type (`common.api.types`, which DRF would coerce),
        whatever the serializer refuses and, where it refuses some, what
        `rules` (the service's own checks, judging only the values given to
        it) find in the fields it accepted. A body the serializer accepts is
        returned as it is: the service runs the same rules when called.
        """
        data = self.request.data
        serializer = serializer_class(data=data, partial=partial, context=self.get_serializer_context())
        valid = serializer.is_valid()
        wrong_types = type_errors(serializer, data)
        if wrong_types or not valid:
            errors: dict[str, Any] = {**(dict(serializer.errors) if not valid else {}), **wrong_types}
            if rules is not None:
                found = rules(accepted_values(serializer, data, refused=errors))
                for name, detail in as_serializer_error(DjangoValidationError(found)).items() if found else ():
                    errors.setdefault(name, detail)
            raise serializers.ValidationError(errors)
        return dict(serializer.validated_data)

    def respond(self, obj: Model, status: int = 200) -> Response:
        """Return `obj` rendered with the endpoint's serializer."""
        return Response(self.get_serializer(obj).data, status=status)


class TenantViewSet(BaseViewSet):
    """Base of endpoints under /api/v1/tenants/<tenant>/: the tenant scope is active while they run."""

    tenant: Tenant
    _scope_token: Token[int | None] | None = None
    _role_token: RequestRoleToken | None = None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        self.actor = actor_of(request)
        tenant, membership = _tenant_and_membership(self.actor, str(kwargs.get("tenant", "")))
        role = role_in_tenant(self.actor, tenant, membership=membership) if tenant is not None else None
        if tenant is None or role is None:
            raise exceptions.NotFound()
        self.tenant, self.role = tenant, role
        self._scope_token = activate_tenant(tenant)
        # The services this request calls check the same role: they reuse it instead of reading it again.
        self._role_token = remember_request_role(self.actor, tenant, role)
        self.deny_unless_allowed()

    def finalize_response(self, request: Request, response: Response, *args: Any, **kwargs: Any) -> Response:
        if self._role_token is not None:
            forget_request_role(self._role_token)
            self._role_token = None
        if self._scope_token is not None:
            deactivate_tenant(self._scope_token)
            self._scope_token = None
        return super().finalize_response(request, response, *args, **kwargs)

    def get_queryset(self) -> QuerySet[Any]:
        if getattr(self, "swagger_fake_view", False):
            return _schema_queryset(self)
        if self._scope_token is None:
            raise exceptions.NotFound()
        return self.scoped_queryset().filter(tenant=self.tenant)


class PlatformViewSet(BaseViewSet):
    """Base of endpoints outside any tenant. Operators act as `operator`; everyone else as `viewer`."""

    write_role: ClassVar[Role] = Role.OPERATOR

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        self.actor = actor_of(request)
        self.role = Role.OPERATOR if self.actor.is_operator else Role.VIEWER
        self.deny_unless_allowed()

    def get_queryset(self) -> QuerySet[Any]:
        if getattr(self, "swagger_fake_view", False):
            return _schema_queryset(self)
        return self.scoped_queryset()
