"""How GPU hosts prove which node they are: one-time join tokens and per-node credentials.

Both are stored as SHA-256 digests of high-entropy secrets (`gpcj_...`,
`gpcn_...`), found by their public prefix; the secret is shown once. A
credential names one node and nothing else: the agent gateway derives the
node of every message from it, never from the message.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class NodeJoinToken(models.Model):
    """A one-time, expiring token an operator hands to a fresh host so that it can join as `node`."""

    node = models.ForeignKey("inventory.Node", on_delete=models.CASCADE, related_name="join_tokens")
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_from = models.CharField(max_length=255, blank=True, help_text="Host name the joining agent gave.")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"join token {self.prefix} for {self.node_id}"


class NodeCredential(models.Model):
    """The credential of one node's agent; at most one is live per node (a new join revokes the old)."""

    node = models.ForeignKey("inventory.Node", on_delete=models.CASCADE, related_name="credentials")
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    host = models.CharField(max_length=255, blank=True, help_text="Host name the agent gave when it joined.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["node"], condition=Q(revoked_at__isnull=True), name="node_credential_one_live_per_node"
            ),
        ]

    def __str__(self) -> str:
        return f"credential {self.prefix} of {self.node_id}"
