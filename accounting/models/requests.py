"""Requests for more: a member asks for more GPU quota or budget, with a reason, until an end date."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from accounting.choices import RequestKind, RequestState
from accounting.models.budgets import MAX_AMOUNT
from tenants.models import MAX_GPUS
from tenants.scoping import TenantOwnedModel


class IncreaseRequest(TenantOwnedModel):
    """A request for more quota or budget for a project (or, with `project` empty, for the tenant itself).

    A quota request names the pool and the guarantee and limit it asks for
    (GPUs, the new values); a budget request names the budget (by unit) and
    the extra amount. Tenant admins decide on project requests, operators on
    the tenant's own. On approval `previous` records what was in force and
    `granted` what the approval set, so that expiry at `ends_at` takes back
    exactly what was granted (`accounting.services.increases`).
    """

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="increase_requests")
    project = models.ForeignKey(
        "tenants.Project", on_delete=models.CASCADE, null=True, blank=True, related_name="increase_requests"
    )
    requester = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    kind = models.CharField(max_length=8, choices=RequestKind.choices)
    pool = models.ForeignKey(
        "inventory.NodePool", on_delete=models.PROTECT, null=True, blank=True, related_name="increase_requests"
    )
    asked_guaranteed = models.PositiveIntegerField(null=True, blank=True, validators=[MaxValueValidator(MAX_GPUS)])
    asked_limit = models.PositiveIntegerField(null=True, blank=True, validators=[MaxValueValidator(MAX_GPUS)])
    budget = models.ForeignKey(
        "accounting.Budget", on_delete=models.SET_NULL, null=True, blank=True, related_name="increase_requests"
    )
    asked_extra = models.DecimalField(
        max_digits=16,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(0), MaxValueValidator(MAX_AMOUNT)],
    )
    reason = models.TextField(max_length=2000)
    ends_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=RequestState.choices, default=RequestState.PENDING)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.TextField(blank=True, max_length=2000)
    previous = models.JSONField(null=True, blank=True)
    granted = models.JSONField(null=True, blank=True)
    # Why the last attempt to expire an approved request could not restore the previous values (empty: none).
    expiry_problem = models.TextField(blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["ends_at"], condition=Q(state__in=["pending", "approved"]), name="increase_open_ends")
        ]
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=RequestKind.values), name="increase_kind_valid"),
            models.CheckConstraint(condition=Q(state__in=RequestState.values), name="increase_state_valid"),
            models.CheckConstraint(condition=~Q(reason=""), name="increase_reason_given"),
            # A quota request names a pool and the numbers it asks for, and no budget; a budget request the reverse.
            models.CheckConstraint(
                condition=(
                    Q(
                        kind=RequestKind.QUOTA,
                        pool__isnull=False,
                        asked_guaranteed__isnull=False,
                        asked_limit__gte=F("asked_guaranteed"),
                        asked_extra__isnull=True,
                    )
                    | Q(kind=RequestKind.BUDGET, pool__isnull=True, asked_limit__isnull=True, asked_extra__gt=0)
                ),
                name="increase_fields_match_kind",
            ),
            # A decision says when it was made (an approved request that expired keeps it).
            models.CheckConstraint(
                condition=~Q(state__in=["approved", "refused"]) | Q(decided_at__isnull=False),
                name="increase_decision_recorded",
            ),
            # What approval changed is recorded, so expiry can take it back.
            models.CheckConstraint(
                condition=~Q(state="approved") | Q(previous__isnull=False, granted__isnull=False),
                name="increase_approval_recorded",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} request #{self.pk} ({self.state})"

    def audit_label(self) -> str:
        """How the audit log names the request: what it is for."""
        owner = f"project {self.project.slug}" if self.project is not None else f"tenant {self.tenant.slug}"
        return f"{self.kind} increase for {owner}"
