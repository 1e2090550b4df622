"""Scoped reads of the tenancy app.

Functions that take no tenant run under the active tenant scope (the
default managers enforce it). The few that must look across tenants say so
in their docstring and use `all_tenants` deliberately.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import User
from django.db.models import Count, Prefetch, Q, QuerySet, Sum
from django.utils import timezone

from tenants.choices import InvitationState, Role
from tenants.context import Actor
from tenants.models import (
    ApiToken,
    AuditEvent,
    Invitation,
    Membership,
    Project,
    ProjectQuota,
    Tenant,
    TenantQuota,
)
from tenants.scoping import tenant_scope


def tenant_by_slug(slug: str) -> Tenant | None:
    """Return the tenant with this slug, or None."""
    return Tenant.objects.filter(slug=slug).first()


def membership_role(user: User, tenant: Tenant) -> Role | None:
    """Return the user's membership role in `tenant`, or None; read under `tenant`'s scope, whatever scope
    the caller holds (none yet when deciding whether to set it)."""
    with tenant_scope(tenant):
        role = Membership.objects.filter(user=user).values_list("role", flat=True).first()
    return Role(role) if role else None


def role_in_tenant(actor: Actor, tenant: Tenant, *, membership: Role | None = None) -> Role | None:
    """Return the role `actor` acts with in `tenant`, or None when it may not see the tenant at all.

    Operators act as `operator` everywhere. A token reaches only its own
    tenant and caps the owner's current membership role at its own role.
    `membership` is the user's membership role in `tenant` when the caller
    read it in this same request (API token authentication does); None reads it.
    """
    if actor.user is None or not actor.user.is_active:
        return None
    if actor.is_operator:
        return Role.OPERATOR
    if actor.token is not None and actor.token.tenant_id != tenant.pk:
        return None
    role = membership if membership is not None else membership_role(actor.user, tenant)
    if role is None or not tenant.is_active:
        return None
    if actor.token is not None:
        token_role = Role(actor.token.role)
        return token_role if role.at_least(token_role) else role
    return role


def tenants_visible_to(actor: Actor) -> QuerySet[Tenant]:
    """Return the tenants `actor` may see: all for operators, else those it is a member of."""
    if actor.is_operator:
        return Tenant.objects.all()
    if actor.user is None:
        return Tenant.objects.none()
    tenants = Tenant.objects.filter(memberships__user=actor.user, is_active=True)
    if actor.token is not None:
        return tenants.filter(pk=actor.token.tenant_id) if actor.token.tenant_id is not None else tenants.none()
    return tenants


def projects_in_scope() -> QuerySet[Project]:
    """Return the active tenant's projects."""
    return Project.objects.all()


def projects_of_member(user: User) -> QuerySet[Project]:
    """Return the active tenant's projects that `user` is assigned to."""
    return Project.objects.filter(memberships__user=user)


def memberships_in_scope() -> QuerySet[Membership]:
    """Return the active tenant's memberships with their users and projects loaded."""
    return Membership.objects.select_related("user").prefetch_related("projects")


def pending_invitations_in_scope() -> QuerySet[Invitation]:
    """Return the active tenant's invitations not yet answered nor withdrawn (expired ones included: their
    admins see them to withdraw and send again), newest first, with their projects loaded."""
    return Invitation.objects.filter(state=InvitationState.PENDING).prefetch_related("projects")


def invitations_in_scope() -> QuerySet[Invitation]:
    """Return every invitation of the active tenant, answered or not, newest first, with their projects."""
    return Invitation.objects.prefetch_related("projects")


def open_invitations_of_user(user: User) -> QuerySet[Invitation]:
    """Return the pending, unexpired invitations addressed to `user`'s name in active tenants, with their
    tenants and projects: an invitation is its addressee's to see (accepting it takes its link too)."""
    projects = Prefetch("projects", queryset=Project.all_tenants.order_by("slug"))
    return (
        Invitation.all_tenants.filter(
            username=user.get_username(),
            state=InvitationState.PENDING,
            expires_at__gt=timezone.now(),
            tenant__is_active=True,
        )
        .select_related("tenant")
        .prefetch_related(projects)
    )


def tenant_quotas_in_scope() -> QuerySet[TenantQuota]:
    """Return the active tenant's quotas per pool."""
    return TenantQuota.objects.select_related("pool", "tenant")


def project_quotas_in_scope() -> QuerySet[ProjectQuota]:
    """Return the active tenant's project quotas."""
    return ProjectQuota.objects.select_related("project", "pool")


@dataclass(frozen=True)
class Oversubscription:
    """Guarantees in one pool above what backs them: `guaranteed` GPUs promised against `backing`.

    `scope` is "pool" (tenants' guarantees against the pool's GPUs in service)
    or "tenant" (a tenant's projects' guarantees against the tenant's guarantee).
    """

    scope: str
    pool_id: int
    pool: str
    guaranteed: int
    backing: int
    across_tenants: bool = False

    @property
    def excess(self) -> int:
        return self.guaranteed - self.backing

    @property
    def message(self) -> str:
        if self.scope == "tenant":
            return (
                f"Projects' guarantees in pool {self.pool} total {self.guaranteed} GPUs but the tenant is "
                f"guaranteed {self.backing}: oversubscribed by {self.excess}. Not every project can have "
                "its guarantee at once."
            )
        promised = (
            f"All tenants' guarantees in pool {self.pool} total {self.guaranteed} GPUs"
            if self.across_tenants
            else f"This tenant is guaranteed {self.guaranteed} GPUs in pool {self.pool}"
        )
        return f"{promised} but the pool has {self.backing} in service: oversubscribed by {self.excess}."


def oversubscribed_guarantees(
    tenant: Tenant, pool_gpus: Mapping[int, int], *, across_tenants: bool
) -> list[Oversubscription]:
    """Return, per pool where `tenant` has a quota, the guarantees that exceed what backs them, in three queries.

    Pool scope: `tenant`'s guarantee (with `across_tenants`, every tenant's:
    for operators only, it looks across tenants) against the pool's GPUs in
    service, `pool_gpus` ({pool id: GPUs}; a pool missing counts 0).
    Tenant scope: `tenant`'s projects' guarantees against the tenant's.
    A warning, never a refusal: oversubscribing is the holder's choice.
    """
    with tenant_scope(tenant):
        quotas = list(TenantQuota.objects.select_related("pool").order_by("pool__name"))
        pool_ids = [q.pool_id for q in quotas]
        projects = dict(
            ProjectQuota.objects.filter(pool_id__in=pool_ids).values_list("pool_id").annotate(total=Sum("guaranteed"))
        )
    everyone = _guaranteed_in_pools(pool_ids)
    found: list[Oversubscription] = []
    for quota in quotas:
        promised = everyone.get(quota.pool_id, 0) if across_tenants else quota.guaranteed
        gpus = pool_gpus.get(quota.pool_id, 0)
        if promised > gpus:
            found.append(Oversubscription("pool", quota.pool_id, quota.pool.name, promised, gpus, across_tenants))
        split = projects.get(quota.pool_id, 0)
        if split > quota.guaranteed:
            found.append(Oversubscription("tenant", quota.pool_id, quota.pool.name, split, quota.guaranteed))
    return found


def _guaranteed_in_pools(pool_ids: list[int]) -> dict[int, int]:
    """Return {pool id: GPUs guaranteed there to every tenant together}; looks across tenants by design."""
    return dict(
        TenantQuota.all_tenants.filter(pool_id__in=pool_ids).values_list("pool_id").annotate(total=Sum("guaranteed"))
    )


def roles_up_to(role: Role) -> list[Role]:
    """Return the roles `role` has every right of: itself and those below it."""
    return [r for r in Role if role.at_least(r)]


def own_tokens_within_reach(actor: Actor) -> QuerySet[ApiToken]:
    """Return the acting user's own tokens that `actor` may list, read and revoke. Looks across tenants.

    The token rule: a credential never manages a token of another tenant, nor
    one more powerful than itself. A browser session reaches all of its
    user's tokens; a tenant token only its owner's tokens bound to the same
    tenant with a role no higher than its own; an operator token (which acts
    as operator in every tenant) all of its owner's tokens, as long as the
    owner is an operator (once not, only the other operator tokens). None
    for the system.
    """
    if actor.user is None:
        return ApiToken.all_tenants.none()
    tokens = ApiToken.all_tenants.filter(user=actor.user).select_related("tenant", "user")
    credential = actor.token
    if credential is None or actor.is_operator:
        return tokens
    bound_alike = Q(tenant__isnull=True) if credential.tenant_id is None else Q(tenant_id=credential.tenant_id)
    return tokens.filter(bound_alike, role__in=roles_up_to(Role(credential.role)))


def audit_events_in_scope() -> QuerySet[AuditEvent]:
    """Return the active tenant's audit events, newest first."""
    return AuditEvent.objects.all()


def audit_events_matching(
    *,
    actor: str = "",
    subject: str = "",
    action: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    """Return the active tenant's audit events, newest first, narrowed by whichever filters are given.

    `actor`: the acting user's name, exactly. `subject`: part of the subject's
    name, or the user name a membership event records. `action`: a prefix
    (`project.` or `project_quota.update`). `since` inclusive, `until` exclusive.
    """
    events = audit_events_in_scope()
    if actor:
        events = events.filter(actor_label=actor)
    if subject:
        events = events.filter(Q(object_repr__icontains=subject) | Q(after__user=subject) | Q(before__user=subject))
    if action:
        events = events.filter(action__startswith=action)
    if since is not None:
        events = events.filter(created_at__gte=since)
    if until is not None:
        events = events.filter(created_at__lt=until)
    return events


def audit_actors_in_scope() -> list[str]:
    """Return the names that acted in the active tenant's audit log, sorted."""
    return list(audit_events_in_scope().order_by("actor_label").values_list("actor_label", flat=True).distinct())


def all_audit_events() -> QuerySet[AuditEvent]:
    """Return every audit event of the platform, newest first. For operators only."""
    return AuditEvent.all_tenants.all()


def tenant_summaries() -> QuerySet[Tenant]:
    """Return tenants annotated with their project and member counts."""
    return Tenant.objects.annotate(
        project_count=Count("projects", distinct=True), member_count=Count("memberships", distinct=True)
    )


def memberships_of_user(user: User) -> QuerySet[Membership]:
    """Return `user`'s memberships in every tenant, with the tenants loaded: a user's own are theirs to see."""
    return (
        Membership.all_tenants.filter(user=user, tenant__is_active=True)
        .select_related("tenant")
        .order_by("tenant__slug")
    )
