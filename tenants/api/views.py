"""API endpoints of the tenancy app: thin adapters over tenants.services and tenants.selectors."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from common.api.schema import SingleObjectSchema
from tenants import selectors, services
from tenants.api import serializers as s
from tenants.api.base import PlatformViewSet, TenantViewSet
from tenants.choices import Role
from tenants.filters import AuditEventFilter, PlatformAuditEventFilter
from tenants.models import ApiToken, AuditEvent, Invitation, Membership, Project, ProjectQuota, Tenant, TenantQuota

_READ = (mixins.ListModelMixin, mixins.RetrieveModelMixin)


class TenantEndpoint(*_READ, PlatformViewSet):  # type: ignore[misc]
    """Tenants: operators see and manage all; others see the tenants they belong to."""

    serializer_class = s.TenantSerializer
    lookup_field = "slug"
    ordering_fields = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    filterset_fields = ["is_active"]

    def scoped_queryset(self) -> QuerySet[Tenant]:
        return selectors.tenants_visible_to(self.actor)

    @extend_schema(request=s.TenantCreateSerializer, responses={201: s.TenantSerializer})
    def create(self, request: Request) -> Response:
        data = self.validated_input(s.TenantCreateSerializer)
        return self.respond(services.create_tenant(actor=self.actor, **data), status.HTTP_201_CREATED)

    @extend_schema(request=s.TenantUpdateSerializer, responses=s.TenantSerializer)
    def partial_update(self, request: Request, slug: str) -> Response:
        data = self.validated_input(s.TenantUpdateSerializer, partial=True)
        return self.respond(services.update_tenant(actor=self.actor, tenant=self.get_object(), **data))

    def destroy(self, request: Request, slug: str) -> Response:
        services.delete_tenant(actor=self.actor, tenant=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class ProjectEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]
    """A tenant's projects: everyone in the tenant reads, tenant admins write."""

    serializer_class = s.ProjectSerializer
    lookup_field = "slug"
    ordering_fields = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]

    def scoped_queryset(self) -> QuerySet[Project]:
        return selectors.projects_in_scope()

    @extend_schema(request=s.ProjectCreateSerializer, responses={201: s.ProjectSerializer})
    def create(self, request: Request, tenant: str) -> Response:
        data = self.validated_input(s.ProjectCreateSerializer)
        return self.respond(
            services.create_project(actor=self.actor, tenant=self.tenant, **data), status.HTTP_201_CREATED
        )

    @extend_schema(request=s.ProjectUpdateSerializer, responses=s.ProjectSerializer)
    def partial_update(self, request: Request, tenant: str, slug: str) -> Response:
        data = self.validated_input(s.ProjectUpdateSerializer, partial=True)
        return self.respond(services.update_project(actor=self.actor, project=self.get_object(), **data))

    def destroy(self, request: Request, tenant: str, slug: str) -> Response:
        services.delete_project(actor=self.actor, project=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class MembershipEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]
    """A tenant's members: everyone in the tenant reads, tenant admins change and remove. Members join by
    answering an invitation (`InvitationEndpoint`), never by an admin's word alone."""

    serializer_class = s.MembershipSerializer
    ordering_fields = ["user__username", "role", "created_at"]
    search_fields = ["user__username", "email"]
    filterset_fields = ["role"]

    def scoped_queryset(self) -> QuerySet[Membership]:
        return selectors.memberships_in_scope()

    @extend_schema(request=s.MembershipUpdateSerializer, responses=s.MembershipSerializer)
    def partial_update(self, request: Request, tenant: str, pk: str) -> Response:
        data = self.validated_input(s.MembershipUpdateSerializer, partial=True)
        return self.respond(services.update_member(actor=self.actor, membership=self.get_object(), **data))

    def destroy(self, request: Request, tenant: str, pk: str) -> Response:
        services.remove_member(actor=self.actor, membership=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]
    """A tenant's invitations, for its admins: POST invites (the answer carries the one-time `invite_url`,
    the same shape whether or not the user name is taken), DELETE withdraws a pending one."""

    serializer_class = s.InvitationSerializer
    read_role = Role.ADMIN
    ordering_fields = ["created_at", "username"]
    filterset_fields = ["state"]

    def scoped_queryset(self) -> QuerySet[Invitation]:
        return selectors.invitations_in_scope()

    @extend_schema(request=s.MembershipCreateSerializer, responses={201: s.IssuedInvitationSerializer})
    def create(self, request: Request, tenant: str) -> Response:
        data = self.validated_input(s.MembershipCreateSerializer)
        issued = services.invite_member(actor=self.actor, tenant=self.tenant, **data)
        body: dict[str, Any] = dict(self.get_serializer(issued.invitation).data)
        body["invite_url"] = request.build_absolute_uri(issued.link_path)
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: s.InvitationSerializer})
    def destroy(self, request: Request, tenant: str, pk: str) -> Response:
        return self.respond(services.withdraw_invitation(actor=self.actor, invitation=self.get_object()))


class InvitationToMeEndpoint(mixins.ListModelMixin, PlatformViewSet):
    """The invitations addressed to the caller's user name; `accept` and `decline` answer one by the secret
    of its link, signed in with a password (a session): an API token acts inside one tenant and cannot."""

    serializer_class = s.InvitationToMeSerializer
    action_roles = {"accept": Role.VIEWER, "decline": Role.VIEWER}

    def scoped_queryset(self) -> QuerySet[Invitation]:
        if self.actor.user is None:
            return Invitation.all_tenants.none()
        return selectors.open_invitations_of_user(self.actor.user)

    @extend_schema(request=s.InvitationAnswerSerializer, responses={201: s.MembershipOfUserSerializer})
    @action(detail=False, methods=["post"])
    def accept(self, request: Request) -> Response:
        secret = self.validated_input(s.InvitationAnswerSerializer)["secret"]
        membership = services.accept_invitation(actor=self.actor, secret=secret)
        return Response(s.MembershipOfUserSerializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.InvitationAnswerSerializer, responses={204: None})
    @action(detail=False, methods=["post"])
    def decline(self, request: Request) -> Response:
        services.decline_invitation(
            actor=self.actor, secret=self.validated_input(s.InvitationAnswerSerializer)["secret"]
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


def _saved(endpoint: TenantViewSet, quota: TenantQuota | ProjectQuota, code: int = status.HTTP_200_OK) -> Response:
    """Answer a quota write with the quota and `warnings`: guarantees in its pool above what backs them (a
    warning, not a refusal; every tenant's guarantees weigh on the pool's GPUs only for operators)."""
    found = selectors.oversubscribed_guarantees(
        endpoint.tenant, s.pool_gpus_in_service([quota.pool_id]), across_tenants=endpoint.actor.is_operator
    )
    body: dict[str, Any] = dict(endpoint.get_serializer(quota).data)
    body["warnings"] = s.QuotaWarningSerializer([w for w in found if w.pool_id == quota.pool_id], many=True).data
    return Response(body, status=code)


class TenantQuotaEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]
    """A tenant's quota per pool: everyone in the tenant reads, only operators write."""

    serializer_class = s.TenantQuotaSerializer
    write_role = Role.OPERATOR
    ordering_fields = ["pool__name"]

    def scoped_queryset(self) -> QuerySet[TenantQuota]:
        return selectors.tenant_quotas_in_scope()

    @extend_schema(request=s.TenantQuotaCreateSerializer, responses={201: s.TenantQuotaSavedSerializer})
    def create(self, request: Request, tenant: str) -> Response:
        data = self.validated_input(s.TenantQuotaCreateSerializer, rules=services.quota_errors)
        pool = data.pop("pool")
        quota = services.create_tenant_quota(
            actor=self.actor, tenant=self.tenant, pool=pool, values=services.QuotaValues().merged(data)
        )
        return _saved(self, quota, status.HTTP_201_CREATED)

    @extend_schema(request=s.QuotaNumbersSerializer, responses=s.TenantQuotaSavedSerializer)
    def partial_update(self, request: Request, tenant: str, pk: str) -> Response:
        data = self.validated_input(s.QuotaNumbersSerializer, partial=True, rules=services.quota_errors)
        return _saved(self, services.update_tenant_quota(actor=self.actor, quota=self.get_object(), changes=data))

    def destroy(self, request: Request, tenant: str, pk: str) -> Response:
        services.delete_tenant_quota(actor=self.actor, quota=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class ProjectQuotaEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]
    """Project quotas: everyone in the tenant reads, tenant admins split the tenant's quota."""

    serializer_class = s.ProjectQuotaSerializer
    ordering_fields = ["project__slug", "pool__name"]
    filterset_fields = ["project__slug", "pool__name"]

    def scoped_queryset(self) -> QuerySet[ProjectQuota]:
        return selectors.project_quotas_in_scope()

    @extend_schema(request=s.ProjectQuotaCreateSerializer, responses={201: s.ProjectQuotaSavedSerializer})
    def create(self, request: Request, tenant: str) -> Response:
        data = self.validated_input(s.ProjectQuotaCreateSerializer, rules=services.quota_errors)
        project, pool = data.pop("project"), data.pop("pool")
        quota = services.create_project_quota(
            actor=self.actor, project=project, pool=pool, values=services.QuotaValues().merged(data)
        )
        return _saved(self, quota, status.HTTP_201_CREATED)

    @extend_schema(request=s.QuotaNumbersSerializer, responses=s.ProjectQuotaSavedSerializer)
    def partial_update(self, request: Request, tenant: str, pk: str) -> Response:
        data = self.validated_input(s.QuotaNumbersSerializer, partial=True, rules=services.quota_errors)
        return _saved(self, services.update_project_quota(actor=self.actor, quota=self.get_object(), changes=data))

    def destroy(self, request: Request, tenant: str, pk: str) -> Response:
        services.delete_project_quota(actor=self.actor, quota=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class TenantTokenEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]
    """Every token of a tenant, for its admins to review and revoke (DELETE revokes, the record stays)."""

    serializer_class = s.ApiTokenSerializer
    read_role = Role.ADMIN
    ordering_fields = ["created_at", "expires_at", "last_used_at"]
    filterset_fields = ["role"]

    def scoped_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.select_related("user", "tenant")

    @extend_schema(responses={200: s.ApiTokenSerializer})
    def destroy(self, request: Request, tenant: str, pk: str) -> Response:
        return self.respond(services.revoke_token(actor=self.actor, token=self.get_object()))


class AuditEventEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]
    """A tenant's audit log, for its admins. Read-only: no interface edits or deletes events."""

    serializer_class = s.AuditEventSerializer
    read_role = Role.ADMIN
    filterset_class = AuditEventFilter
    ordering_fields = ["created_at"]

    def scoped_queryset(self) -> QuerySet[AuditEvent]:
        return selectors.audit_events_in_scope()


class PlatformAuditEventEndpoint(*_READ, PlatformViewSet):  # type: ignore[misc]
    """The whole platform's audit log, for operators."""

    serializer_class = s.AuditEventSerializer
    read_role = Role.OPERATOR
    filterset_class = PlatformAuditEventFilter
    ordering_fields = ["created_at"]

    def scoped_queryset(self) -> QuerySet[AuditEvent]:
        return selectors.all_audit_events()


class TokenEndpoint(*_READ, PlatformViewSet):  # type: ignore[misc]
    """The caller's own API tokens within its credential's reach (`own_tokens_within_reach`): a token
    sees none of another tenant and none more powerful than itself. The secret is in the creation
    response only; DELETE revokes."""

    serializer_class = s.ApiTokenSerializer
    action_roles = {"create": Role.VIEWER, "destroy": Role.VIEWER}
    ordering_fields = ["created_at", "expires_at"]

    def scoped_queryset(self) -> QuerySet[ApiToken]:
        return selectors.own_tokens_within_reach(self.actor)

    @extend_schema(request=s.ApiTokenCreateSerializer, responses={201: s.IssuedTokenSerializer})
    def create(self, request: Request) -> Response:
        data = self.validated_input(s.ApiTokenCreateSerializer)
        issued = services.create_token(actor=self.actor, **data)
        body = dict(self.get_serializer(issued.token).data)
        body["secret"] = issued.secret
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: s.ApiTokenSerializer})
    def destroy(self, request: Request, pk: str) -> Response:
        return self.respond(services.revoke_token(actor=self.actor, token=self.get_object()))


class MeEndpoint(PlatformViewSet):
    """The caller: user, operator flag, the token in use, and memberships with roles."""

    serializer_class = s.MeSerializer
    queryset = Membership.all_tenants.none()  # only names the model for the OpenAPI schema
    # One object, not a page: nothing to paginate, filter or order.
    pagination_class = None
    filter_backends: list[Any] = []
    schema = SingleObjectSchema()

    @extend_schema(responses=s.MeSerializer)
    def list(self, request: Request) -> Response:
        memberships = selectors.memberships_of_user(request.user)  # type: ignore[arg-type]
        if self.actor.token is not None:
            # A token shows only its own tenant; an operator token belongs to none.
            memberships = memberships.filter(tenant_id=self.actor.token.tenant_id or 0)
        return Response(s.MeSerializer({"actor": self.actor, "memberships": memberships}).data)
