"""Serializers of the tenancy API: output shapes and input shapes. Rules live in the services."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from common.api.fields import ID_MAX, Integer
from inventory.selectors import pool_capacity, pools_open_to_tenant
from tenants.api.fields import GpuLimitField, MembershipRoleField, ScopedSlugField
from tenants.choices import MEMBERSHIP_ROLES, Role
from tenants.models import ApiToken, AuditEvent, Invitation, Membership, Project, ProjectQuota, Tenant, TenantQuota
from tenants.selectors import projects_in_scope, tenants_visible_to

MAX_TEXT = 2000


def _bytes_limit(help_text: str) -> Integer:
    """A storage quota in bytes (a 64-bit column): 0 or more, null for no limit."""
    return Integer(min_value=0, max_value=ID_MAX, required=False, allow_null=True, help_text=help_text)


TENANT_STORAGE_HELP = "Bytes every volume of the tenant may hold together; null: no limit."
HOME_LIMIT_HELP = "Bytes each member's home may hold; null: no limit."
PROJECT_STORAGE_HELP = "Bytes the project's volumes and datasets may hold together, within the tenant's; null: none."


def _projects(context: dict[str, Any]) -> Any:
    return projects_in_scope()


def _open_pools(context: dict[str, Any]) -> Any:
    return pools_open_to_tenant(context["tenant"].pk)


def _visible_tenants(context: dict[str, Any]) -> Any:
    return tenants_visible_to(context["actor"])


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = [
            "slug", "name", "description", "is_active", "storage_limit_bytes", "home_limit_bytes", "created_at",
            "updated_at",
        ]  # fmt: skip
        read_only_fields = fields


class TenantCreateSerializer(serializers.Serializer):
    slug = serializers.CharField(max_length=40)
    name = serializers.CharField(max_length=120)
    description = serializers.CharField(max_length=MAX_TEXT, required=False, allow_blank=True, default="")


class TenantUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=120, required=False)
    description = serializers.CharField(max_length=MAX_TEXT, required=False, allow_blank=True)
    is_active = serializers.BooleanField(required=False)
    storage_limit_bytes = _bytes_limit(TENANT_STORAGE_HELP)
    home_limit_bytes = _bytes_limit(HOME_LIMIT_HELP)


class ProjectSerializer(serializers.ModelSerializer):
    class Meta:
        model = Project
        fields = ["slug", "name", "description", "storage_limit_bytes", "created_at", "updated_at"]
        read_only_fields = fields


class ProjectCreateSerializer(TenantCreateSerializer):
    pass


class ProjectUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=120, required=False)
    description = serializers.CharField(max_length=MAX_TEXT, required=False, allow_blank=True)
    storage_limit_bytes = _bytes_limit(PROJECT_STORAGE_HELP)


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)
    # The tenant's own contact address for the member, never the account's (which other tenants may share).
    email = serializers.CharField(read_only=True)
    projects: Any = serializers.SlugRelatedField(slug_field="slug", many=True, read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "username", "email", "role", "projects", "created_at"]
        read_only_fields = fields


class MembershipCreateSerializer(serializers.Serializer):
    """An invitation's shape; its rules (user name, address, role, the tenant's projects) are the service's,
    which reports every failing field at once."""

    username = serializers.CharField(max_length=150)
    email = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=254,
        help_text="The tenant's contact address for them; leave out for none.",
    )
    role = MembershipRoleField(default=Role.MEMBER)
    projects = serializers.ListField(
        child=serializers.CharField(max_length=40),
        required=False,
        max_length=1000,
        help_text="Slugs of the tenant's projects the member joins.",
    )


class InvitationSerializer(serializers.ModelSerializer):
    """An invitation as its tenant's admins see it: `state` is `invited` until it is answered or withdrawn."""

    projects: Any = serializers.SlugRelatedField(slug_field="slug", many=True, read_only=True)
    # Blank when the inviter gave none: the schema must not promise an e-mail format.
    email = serializers.CharField(read_only=True)

    class Meta:
        model = Invitation
        fields = ["id", "username", "email", "role", "projects", "state", "created_at", "expires_at", "answered_at"]
        read_only_fields = fields


class IssuedInvitationSerializer(InvitationSerializer):
    """An invitation as returned once, at creation, with its one-time link: the same shape whether or not
    the user name is taken anywhere."""

    invite_url = serializers.CharField(read_only=True)

    class Meta(InvitationSerializer.Meta):
        fields = [*InvitationSerializer.Meta.fields, "invite_url"]
        read_only_fields = fields


class InvitationToMeSerializer(serializers.ModelSerializer):
    """An invitation as its addressee sees it: which tenant, with which role and projects, until when."""

    tenant: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    tenant_name = serializers.CharField(source="tenant.name", read_only=True)
    projects: Any = serializers.SlugRelatedField(slug_field="slug", many=True, read_only=True)

    class Meta:
        model = Invitation
        fields = ["id", "tenant", "tenant_name", "role", "projects", "expires_at"]
        read_only_fields = fields


class InvitationAnswerSerializer(serializers.Serializer):
    """The secret of an invitation link: the last part of its path."""

    secret = serializers.CharField(max_length=200)


class MembershipUpdateSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=MEMBERSHIP_ROLES, required=False)
    projects = ScopedSlugField(selector=_projects, many=True, required=False)


class QuotaNumbersSerializer(serializers.Serializer):
    """The numbers of a quota; ranges and cross-quota rules are checked by the services."""

    guaranteed = Integer(required=False)
    limit = Integer(required=False, allow_null=True, help_text="GPUs at most, borrowing included; null: no limit.")
    weight = Integer(required=False)
    max_notebooks_per_user = Integer(required=False, allow_null=True)
    max_pending_workloads = Integer(required=False, allow_null=True)
    max_runtime_seconds = Integer(required=False, allow_null=True)


QUOTA_FIELDS = [
    "guaranteed",
    "limit",
    "weight",
    "max_notebooks_per_user",
    "max_pending_workloads",
    "max_runtime_seconds",
    "updated_at",
]


def pool_gpus_in_service(pool_ids: list[int]) -> dict[int, int]:
    """Return {pool id: GPUs on its nodes in service}, as the oversubscription warnings weigh guarantees."""
    return {pool_id: sum(m["total"] for m in models) for pool_id, models in pool_capacity(pool_ids).items()}


class QuotaWarningSerializer(serializers.Serializer):
    """Guarantees above what backs them in one pool: saved all the same, and said."""

    scope = serializers.ChoiceField(
        choices=["pool", "tenant"],
        read_only=True,
        help_text="pool: tenants' guarantees against the pool's GPUs; tenant: projects' against the tenant's.",
    )
    pool = serializers.CharField(read_only=True)
    guaranteed = Integer(read_only=True, help_text="GPUs guaranteed in all.")
    available = Integer(source="backing", read_only=True, help_text="GPUs that back them.")
    excess = Integer(read_only=True)
    message = serializers.CharField(read_only=True)


class TenantQuotaSerializer(serializers.ModelSerializer):
    tenant: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    limit = GpuLimitField(help_text="null: no limit.")

    class Meta:
        model = TenantQuota
        fields = ["id", "tenant", "pool", *QUOTA_FIELDS]
        read_only_fields = fields


class TenantQuotaCreateSerializer(QuotaNumbersSerializer):
    pool = ScopedSlugField(selector=_open_pools, slug_field="name")


class ProjectQuotaSerializer(serializers.ModelSerializer):
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    limit = GpuLimitField(help_text="null: no limit of the project's own (the tenant's applies).")

    class Meta:
        model = ProjectQuota
        fields = ["id", "project", "pool", *QUOTA_FIELDS]
        read_only_fields = fields


class TenantQuotaSavedSerializer(TenantQuotaSerializer):
    """A tenant quota as a write answers it: with where guarantees now oversubscribe its pool."""

    warnings = QuotaWarningSerializer(many=True, read_only=True)

    class Meta(TenantQuotaSerializer.Meta):
        fields = [*TenantQuotaSerializer.Meta.fields, "warnings"]
        read_only_fields = fields


class ProjectQuotaCreateSerializer(QuotaNumbersSerializer):
    project = ScopedSlugField(selector=_projects)
    pool = ScopedSlugField(selector=_open_pools, slug_field="name")


class ProjectQuotaSavedSerializer(ProjectQuotaSerializer):
    """A project quota as a write answers it: with where guarantees now oversubscribe its pool."""

    warnings = QuotaWarningSerializer(many=True, read_only=True)

    class Meta(ProjectQuotaSerializer.Meta):
        fields = [*ProjectQuotaSerializer.Meta.fields, "warnings"]
        read_only_fields = fields


class ApiTokenSerializer(serializers.ModelSerializer):
    # Null for an operator token, which belongs to no tenant.
    tenant: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    owner = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "tenant",
            "owner",
            "role",
            "prefix",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
        ]
        read_only_fields = fields


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80)
    tenant = ScopedSlugField(selector=_visible_tenants, required=False, allow_null=True, default=None)
    role = serializers.ChoiceField(
        choices=Role.choices,
        required=False,
        help_text="Default: your own role in the tenant (tenant admin for an operator; operator without a tenant), "
        "never above the token you call with.",
    )
    expires_in_days = Integer(default=90, min_value=1, max_value=settings.API_TOKEN_MAX_DAYS)


class IssuedTokenSerializer(ApiTokenSerializer):
    """A token as returned once, at creation, with its secret."""

    secret = serializers.CharField(read_only=True)

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class AuditEventSerializer(serializers.ModelSerializer):
    tenant = Integer(source="tenant_id", read_only=True, allow_null=True)  # null: platform-wide
    actor = serializers.CharField(source="actor_label", read_only=True)

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "created_at",
            "tenant",
            "actor",
            "token_prefix",
            "via",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "before",
            "after",
            "request_id",
            "source_ip",
        ]
        read_only_fields = fields


class MembershipOfUserSerializer(serializers.ModelSerializer):
    tenant: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    tenant_name = serializers.CharField(source="tenant.name", read_only=True)

    class Meta:
        model = Membership
        fields = ["tenant", "tenant_name", "role"]
        read_only_fields = fields


class MeSerializer(serializers.Serializer):
    """The caller as the `me` endpoint shows it."""

    username = serializers.CharField(source="actor.user.username", read_only=True)
    email = serializers.CharField(source="actor.user.email", read_only=True)
    is_operator = serializers.BooleanField(source="actor.is_operator", read_only=True)
    token = ApiTokenSerializer(source="actor.token", read_only=True, allow_null=True)
    memberships = MembershipOfUserSerializer(many=True, read_only=True)
