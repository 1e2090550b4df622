"""Joining GPU hosts: one-time join tokens, per-node credentials, their revocation.

A host never holds the console's SECRET_KEY, database or broker
credentials. An operator issues a join token for a registered node; the host's
agent exchanges it once (`redeem_join_token`) for a credential of that node
alone, and from then on speaks to the console's agent gateway over HTTPS with
it. Every gateway request is authenticated by `authenticate_node`, which
reads the credential row each time: a revocation or a retired node cuts the
agent off at its next request.

Secrets are 32 random bytes, stored as SHA-256 digests and found by a public
prefix (`gpcj_<prefix>_<key>` for join tokens, `gpcn_<prefix>_<key>` for
credentials); a slow password hash buys nothing for secrets of that entropy.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypeVar

from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from common import doorbell
from common.errors import Conflict
from inventory.choices import NodeState
from inventory.models import Node, NodeCredential, NodeJoinToken, agent_queue_for
from inventory.services.nodes import record_node_event
from inventory.services.provisioning import begin_provisioning
from tenants.context import SYSTEM, Actor
from tenants.services import record_audit_event
from tenants.services.access import require_operator

log = logging.getLogger(__name__)

JOIN_SCHEME = "gpcj"
CREDENTIAL_SCHEME = "gpcn"
DEFAULT_JOIN_TTL = timedelta(hours=1)
MAX_JOIN_TTL = timedelta(days=7)
# last_seen_at is advisory: refreshed at most this often, so a busy agent's requests do not all write its row.
_SEEN_RESOLUTION = timedelta(seconds=30)
# States a join starts provisioning from; a node in service that re-joins (a re-installed host) keeps its state.
_PROVISION_ON_JOIN = frozenset({NodeState.REGISTERED, NodeState.FAILED})


class JoinRefused(Exception):
    """A join token that cannot be redeemed; the message says why, in words fit for the host's operator."""


class CredentialRejected(Exception):
    """A presented node credential authenticates no node; the message says why."""


RowT = TypeVar("RowT", NodeJoinToken, NodeCredential)


@dataclass(frozen=True)
class IssuedSecret(Generic[RowT]):
    """A new join token or credential row and its secret, which exists only here and is never stored."""

    row: RowT
    secret: str


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _new_secret(scheme: str) -> tuple[str, str, str]:
    """Return (prefix, secret, digest) of a fresh `<scheme>_<prefix>_<key>` secret."""
    prefix = secrets.token_hex(6)
    secret = f"{scheme}_{prefix}_{secrets.token_urlsafe(32)}"
    return prefix, secret, _digest(secret)


def _prefix_of(secret: str, scheme: str) -> str | None:
    parts = secret.split("_", 2)
    if len(parts) != 3 or parts[0] != scheme or not parts[1] or not parts[2]:
        return None
    return parts[1]


def _locked(node: Node) -> Node:
    return Node.objects.select_for_update().get(pk=node.pk)


@transaction.atomic
def issue_join_token(*, actor: Actor, node: Node, ttl: timedelta = DEFAULT_JOIN_TTL) -> IssuedSecret[NodeJoinToken]:
    """Issue a one-time join token for `node`, valid for `ttl`; operators only. Earlier unused tokens are void.

    Raises Conflict for a retired or simulated node (nothing joins as those)
    and ValueError for a `ttl` outside (0, MAX_JOIN_TTL].
    """
    require_operator(actor)
    if not timedelta(0) < ttl <= MAX_JOIN_TTL:
        raise ValueError(f"a join token lives more than 0 seconds and at most {MAX_JOIN_TTL}")
    node = _locked(node)
    if node.state == NodeState.RETIRED:
        raise Conflict("A retired node cannot be joined.", code="node_retired", details={"current_state": node.state})
    if node.is_simulated:
        raise Conflict("Simulated nodes have no agent to join.", code="node_simulated")
    now = timezone.now()
    # One token in flight per node: issuing a new one voids the last, so a leaked old one is worthless.
    NodeJoinToken.objects.filter(node=node, used_at__isnull=True, expires_at__gt=now).update(expires_at=now)
    prefix, secret, digest = _new_secret(JOIN_SCHEME)
    token = NodeJoinToken.objects.create(
        node=node, prefix=prefix, digest=digest, created_by=actor.user, expires_at=now + ttl
    )
    record_audit_event(
        actor=actor, action="node.join_token", obj=node, tenant_id=None, after={"token": prefix, "expires": str(ttl)}
    )
    record_node_event(
        node,
        kind="agent.join_token",
        actor=actor,
        message=f"Join token {prefix} issued, valid until {token.expires_at:%Y-%m-%d %H:%M} UTC.",
    )
    return IssuedSecret(token, secret)


@transaction.atomic
def redeem_join_token(*, secret: str, host: str = "", agent_version: str = "") -> IssuedSecret[NodeCredential]:
    """Exchange a join token for a new credential of its node; the token is spent either way once it matched.

    Revokes the node's earlier credential (the host it named is replaced),
    records the join, and starts provisioning a registered or failed node
    (its probe goes out once the transaction commits). Raises JoinRefused for
    an unknown, spent or expired token, or a node retired meanwhile.
    """
    prefix = _prefix_of(secret.strip(), JOIN_SCHEME)
    token = (
        NodeJoinToken.objects.select_for_update(of=("self",)).select_related("node").filter(prefix=prefix).first()
        if prefix
        else None
    )
    if token is None or not hmac.compare_digest(token.digest, _digest(secret.strip())):
        raise JoinRefused("This join token is not valid: ask the operator for a new one.")
    if token.used_at is not None:
        raise JoinRefused("This join token was already used: ask the operator for a new one.")
    now = timezone.now()
    if token.expires_at <= now:
        raise JoinRefused("This join token has expired: ask the operator for a new one.")
    node = _locked(token.node)
    if node.state == NodeState.RETIRED:
        raise JoinRefused(f"Node {node.name} is retired.")
    host = host.strip()[:255]
    token.used_at, token.used_from = now, host
    token.save(update_fields=["used_at", "used_from"])
    replaced = revoke_credentials(node, actor=SYSTEM, reason="replaced by a new join")
    prefix, credential_secret, digest = _new_secret(CREDENTIAL_SCHEME)
    credential = NodeCredential.objects.create(node=node, prefix=prefix, digest=digest, host=host, last_seen_at=now)
    note = " (the earlier credential is revoked)" if replaced else ""
    record_node_event(
        node,
        kind="agent.joined",
        message=f"Agent {agent_version or '?'} on host {host or '?'} joined with token {token.prefix}{note}.",
        data={"host": host, "agent_version": agent_version[:40], "credential": prefix},
    )
    if node.state in _PROVISION_ON_JOIN:
        begin_provisioning(node, actor=SYSTEM)
    return IssuedSecret(credential, credential_secret)


def authenticate_node(secret: str) -> NodeCredential:
    """Return the live credential `secret` names, with its node loaded; raises CredentialRejected.

    Checked on every request: a revoked credential or a retired node is refused at once.
    """
    prefix = _prefix_of(secret, CREDENTIAL_SCHEME)
    credential = NodeCredential.objects.select_related("node").filter(prefix=prefix).first() if prefix else None
    if credential is None or not hmac.compare_digest(credential.digest, _digest(secret)):
        raise CredentialRejected("Unknown node credential.")
    if credential.revoked_at is not None:
        raise CredentialRejected("This node credential was revoked: join the host again.")
    if credential.node.state == NodeState.RETIRED:
        raise CredentialRejected(f"Node {credential.node.name} is retired.")
    now = timezone.now()
    if credential.last_seen_at is None or now - credential.last_seen_at >= _SEEN_RESOLUTION:
        NodeCredential.objects.filter(pk=credential.pk).update(last_seen_at=now)
        credential.last_seen_at = now
    return credential


# A command long-poll holds no database connection while it waits (a thousand waiting agents would hold a
# thousand): it asks the cache whether its credential was cut off meanwhile. Kept longer than any wait.
_CUT_OFF_KEY = "agent.cut-off.{prefix}"
_CUT_OFF_SECONDS = 300


def is_cut_off(credential: NodeCredential) -> bool:
    """Return whether `credential` was revoked since it was read (for waits that do not read it again)."""
    return bool(cache.get(_CUT_OFF_KEY.format(prefix=credential.prefix)))


def _cut_off(node: Node, keys: dict[str, int]) -> None:
    """Mark credentials cut off for waiting polls and wake the one waiting on the node's queue."""
    cache.set_many(keys, _CUT_OFF_SECONDS)
    try:
        doorbell.ring(agent_queue_for(node.name))
    except Exception:
        # The poll still ends by its own wait and gets nothing: the cache says it is cut off.
        log.warning("could not wake the command poll of %s", node.name, exc_info=True)


def revoke_credentials(node: Node, *, actor: Actor, reason: str) -> int:
    """Revoke every live credential of `node` (no rights check: callers check); return how many. Idempotent.

    Must run inside a transaction; waiting command polls hear of it once it commits.
    """
    live = list(NodeCredential.objects.filter(node=node, revoked_at__isnull=True).values_list("prefix", flat=True))
    revoked = NodeCredential.objects.filter(prefix__in=live).update(
        revoked_at=timezone.now(), revoked_reason=reason[:200]
    )
    keys = {_CUT_OFF_KEY.format(prefix=prefix): 1 for prefix in live}
    if live:
        transaction.on_commit(lambda: _cut_off(node, keys))
    if revoked:
        record_node_event(node, kind="agent.revoked", actor=actor, message=f"Agent credential revoked: {reason}")
    return revoked


@transaction.atomic
def revoke_node_credentials(*, actor: Actor, node: Node, reason: str = "") -> Node:
    """Cut the node's agent off now: revoke its credential and void unused join tokens; operators only."""
    require_operator(actor)
    node = _locked(node)
    revoked = revoke_credentials(node, actor=actor, reason=reason.strip() or "revoked by an operator")
    record_audit_event(actor=actor, action="node.revoke_agent", obj=node, tenant_id=None, after={"revoked": revoked})
    NodeJoinToken.objects.filter(node=node, used_at__isnull=True).update(expires_at=timezone.now())
    return node


def join_command(console_url: str, secret: str) -> str:
    """Return the command a host's operator runs to join with `secret` (see docs/fleet.md)."""
    return f"gpucloud agent join {console_url} {secret}"


def live_credential(node: Node) -> NodeCredential | None:
    """Return the node's live credential, if it has joined."""
    return NodeCredential.objects.filter(node=node, revoked_at__isnull=True).first()
