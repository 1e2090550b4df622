"""Tenants, their projects, members, quotas, API tokens and the audit log."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import F, Q

from tenants.choices import MEMBERSHIP_ROLES, InvitationState, Role, Via
from tenants.scoping import TenantOwnedModel

SLUG_RULE = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$",
    "Use 1 to 40 lowercase letters, digits or hyphens, starting and ending with a letter or digit.",
    code="invalid_slug",
)
# Quota numbers above these are typos, not plans: no pool holds a million GPUs.
MAX_GPUS = 100_000
MAX_WEIGHT = 1_000
MAX_COUNT = 100_000
MAX_RUNTIME_SECONDS = 365 * 24 * 3600
# A GPU limit of this many means "no limit at this level": the level above (or the pool) decides. The
# column stays a number because the scheduler, the simulator and the submission checks compare with it.
NO_LIMIT = MAX_GPUS


class Tenant(models.Model):
    """An organisation sharing the cloud; owns projects, members, quotas and tokens."""

    slug = models.CharField(max_length=40, unique=True, validators=[SLUG_RULE])
    name = models.CharField(max_length=120)
    description = models.TextField(blank=True, max_length=2000)
    is_active = models.BooleanField(default=True)
    # Execution settings of the tenant's workloads; empty means the platform default from the settings.
    notebook_idle_timeout_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(60), MaxValueValidator(MAX_RUNTIME_SECONDS)]
    )
    log_retention_days = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(3650)]
    )
    # Storage quotas (set by operators): every volume of the tenant together, and each member's home.
    # Empty means no limit.
    storage_limit_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    home_limit_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Project(TenantOwnedModel):
    """A unit of work inside a tenant that receives a share of the tenant's quota."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="projects")
    slug = models.CharField(max_length=40, validators=[SLUG_RULE])
    name = models.CharField(max_length=120)
    description = models.TextField(blank=True, max_length=2000)
    # The project's storage quota (set by tenant admins, within the tenant's): its volumes and datasets
    # together. Empty means only the tenant's quota applies.
    storage_limit_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        constraints = [models.UniqueConstraint(fields=["tenant", "slug"], name="project_slug_unique_in_tenant")]

    def __str__(self) -> str:
        return self.slug


class Membership(TenantOwnedModel):
    """A user's role in one tenant, and the projects they work in there.

    `email` is the tenant's own contact address for the member, as its admins
    gave it when inviting; the account's own address (and name) is never
    shown to a tenant, because the account may belong to other tenants too.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=MEMBERSHIP_ROLES, default=Role.MEMBER)
    email = models.EmailField(blank=True)
    projects = models.ManyToManyField(Project, blank=True, related_name="memberships")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user__username"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_per_tenant"),
            models.CheckConstraint(condition=Q(role__in=["viewer", "member", "admin"]), name="membership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.tenant_id}:{self.role}"

    def audit_label(self) -> str:
        """How the audit log names the membership: its user's name."""
        return self.user.get_username()


class Invitation(TenantOwnedModel):
    """An offer to join a tenant, addressed to a user name, answered through its one-time link.

    Nothing joins the tenant until the invitation is accepted: by its link
    alone for a user name nobody holds yet (the new account is made then,
    with the password its owner chooses), by its link and a session of that
    account for one that exists. Only a SHA-256 digest of the link's secret
    is stored. `user` is the account that accepted.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    username = models.CharField(max_length=150)
    email = models.EmailField(blank=True)
    role = models.CharField(max_length=16, choices=MEMBERSHIP_ROLES, default=Role.MEMBER)
    projects = models.ManyToManyField(Project, blank=True, related_name="invitations")
    state = models.CharField(max_length=16, choices=InvitationState.choices, default=InvitationState.PENDING)
    digest = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "username"], condition=Q(state="invited"), name="invitation_one_pending_per_name"
            ),
            models.CheckConstraint(condition=Q(role__in=["viewer", "member", "admin"]), name="invitation_role_valid"),
            models.CheckConstraint(
                condition=Q(state__in=["invited", "accepted", "declined", "revoked"]), name="invitation_state_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.username}@{self.tenant_id}:{self.state}"

    def audit_label(self) -> str:
        """How the audit log names the invitation: the user name it is addressed to."""
        return self.username


class QuotaFields(models.Model):
    """GPU quota numbers shared by tenant and project quotas.

    `guaranteed` GPUs are always available to the holder and reclaimable from
    borrowers; `limit` caps what it may hold, borrowing included; `weight` is
    its share of idle capacity above guarantees. Count limits are None when
    the level above (or nothing) decides.
    """

    guaranteed = models.PositiveIntegerField(default=0, validators=[MaxValueValidator(MAX_GPUS)])
    limit = models.PositiveIntegerField(default=0, validators=[MaxValueValidator(MAX_GPUS)])
    weight = models.PositiveIntegerField(default=1, validators=[MaxValueValidator(MAX_WEIGHT)])
    max_notebooks_per_user = models.PositiveIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(MAX_COUNT)]
    )
    max_pending_workloads = models.PositiveIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(MAX_COUNT)]
    )
    max_runtime_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(60), MaxValueValidator(MAX_RUNTIME_SECONDS)]
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True

    @property
    def has_limit(self) -> bool:
        """Whether `limit` caps this holder (False for NO_LIMIT)."""
        return self.limit < NO_LIMIT


class TenantQuota(TenantOwnedModel, QuotaFields):
    """What a tenant may use in one node pool; set by operators."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey("inventory.NodePool", on_delete=models.PROTECT, related_name="tenant_quotas")

    class Meta:
        ordering = ["tenant__slug", "pool__name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "pool"], name="tenant_quota_unique_per_pool"),
            models.CheckConstraint(condition=Q(limit__gte=F("guaranteed")), name="tenant_quota_limit_gte_guaranteed"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.pool_id}: {self.guaranteed}..{self.limit}"

    def audit_label(self) -> str:
        """How the audit log names the quota: tenant and pool by name."""
        return f"{self.tenant.slug} in pool {self.pool.name}"


class ProjectQuota(TenantOwnedModel, QuotaFields):
    """What a project may use in one node pool; set by tenant admins inside the tenant's quota."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="project_quotas")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey("inventory.NodePool", on_delete=models.PROTECT, related_name="project_quotas")

    class Meta:
        ordering = ["project__slug", "pool__name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "pool"], name="project_quota_unique_per_pool"),
            models.CheckConstraint(condition=Q(limit__gte=F("guaranteed")), name="project_quota_limit_gte_guaranteed"),
        ]

    def __str__(self) -> str:
        return f"{self.project_id}/{self.pool_id}: {self.guaranteed}..{self.limit}"

    def audit_label(self) -> str:
        """How the audit log names the quota: project and pool by name."""
        return f"{self.project.slug} in pool {self.pool.name}"


class ApiToken(TenantOwnedModel):
    """A personal API token bound to one tenant (or, for operators, to the platform).

    Only a SHA-256 digest of the secret is stored; the secret is shown once.
    The token's role caps the owner's current role, it never adds to it.
    """

    # Nullable here alone: operator tokens belong to no tenant.
    tenant = models.ForeignKey(  # type: ignore[assignment]
        Tenant, on_delete=models.CASCADE, related_name="tokens", null=True, blank=True
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    # The token that minted this one, when a token did: a child never outlives it and is revoked with it.
    parent = models.ForeignKey(
        "self", on_delete=models.CASCADE, null=True, blank=True, related_name="children", editable=False
    )
    name = models.CharField(max_length=80)
    role = models.CharField(max_length=16, choices=Role.choices)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # Only operator tokens live outside a tenant, and they only there.
            models.CheckConstraint(
                condition=(Q(role="operator") & Q(tenant__isnull=True))
                | (~Q(role="operator") & Q(tenant__isnull=False)),
                name="api_token_tenant_matches_role",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix})"


class AuditEvent(TenantOwnedModel):
    """One state-changing action: who, where, what, and the object before and after.

    Append-only: database triggers refuse UPDATE and DELETE. The tenant and
    actor references carry no database constraint so the record outlives
    the objects it names; `actor_label` keeps the name that acted.
    """

    # Nullable here: platform events (node pools, operators) belong to no tenant.
    tenant = models.ForeignKey(  # type: ignore[assignment]
        Tenant, on_delete=models.DO_NOTHING, db_constraint=False, null=True, blank=True, related_name="+"
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )
    actor_label = models.CharField(max_length=150)
    token_prefix = models.CharField(max_length=16, blank=True)
    via = models.CharField(max_length=8, choices=Via.choices)
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    source_ip = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="audit_tenant_time")]

    def __str__(self) -> str:
        return f"{self.action} {self.object_type}:{self.object_id} by {self.actor_label}"
