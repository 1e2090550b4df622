"""Revocation: telling a user's open streams that their access may have changed.

Every live consumer (and the notebook proxy's WebSocket leg) joins its
user's group `access.user.<id>` (`common.live_layer.access_group`). When
something that decides access changes (a membership's role or its removal,
a token revoked or deleted, a user deactivated or their password changed,
a tenant deactivated, a logout), the change is announced to the users
concerned after commit; each of their consumers then re-checks its own
principal and object from the database and closes with 4403 if it lost
access. Nothing runs per connection while nothing changes: no polling,
only a slow backstop re-check (`LIVE_RECHECK_SECONDS`) for changes made
around these signals (a raw UPDATE) or announcements lost with Redis.

The tenancy app knows nothing of this: the announcements hang on model
signals and `user_logged_out`, connected in `FrontendConfig.ready`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import User
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from common.live_layer import Outgoing, access_group, publish
from jobs.live import publish_workload_deleted
from jobs.models import Workload
from tenants.models import ApiToken, Membership, Tenant
from tenants.scoping import tenant_scope


def announce_access_changed(user_ids: Iterable[int]) -> None:
    """After commit, tell the open streams of these users to re-check their access."""
    messages: list[Outgoing] = [(access_group(pk), {"type": "access.changed"}) for pk in sorted(set(user_ids))]
    if messages:
        transaction.on_commit(lambda: publish(messages))


def _membership_changed(sender: type[Membership], instance: Membership, **kwargs: Any) -> None:
    announce_access_changed([instance.user_id])


def _token_changed(sender: type[ApiToken], instance: ApiToken, created: bool = False, **kwargs: Any) -> None:
    if not created:
        announce_access_changed([instance.user_id])


def _user_changed(sender: type[User], instance: User, created: bool = False, **kwargs: Any) -> None:
    # Every login saves last_login alone: that changes nobody's access.
    if not created and set(kwargs.get("update_fields") or ()) != {"last_login"}:
        announce_access_changed([instance.pk])


def _tenant_changed(sender: type[Tenant], instance: Tenant, **kwargs: Any) -> None:
    # A deleted tenant's memberships are deleted with it and announce themselves.
    if not instance.is_active:
        with tenant_scope(instance):
            members = list(Membership.objects.values_list("user_id", flat=True))
        announce_access_changed(members)


def _logged_out(sender: Any, request: Any, user: User | None, **kwargs: Any) -> None:
    if user is not None:
        announce_access_changed([user.pk])


def _workload_deleted(sender: type[Workload], instance: Workload, **kwargs: Any) -> None:
    publish_workload_deleted(instance.pk)


def connect_signals() -> None:
    """Connect the announcements to the signals that carry access changes; idempotent (named receivers)."""
    post_save.connect(_membership_changed, sender=Membership, dispatch_uid="live-membership-saved")
    post_delete.connect(_membership_changed, sender=Membership, dispatch_uid="live-membership-deleted")
    post_save.connect(_token_changed, sender=ApiToken, dispatch_uid="live-token-saved")
    post_delete.connect(_token_changed, sender=ApiToken, dispatch_uid="live-token-deleted")
    post_save.connect(_user_changed, sender=User, dispatch_uid="live-user-saved")
    post_delete.connect(_user_changed, sender=User, dispatch_uid="live-user-deleted")
    post_save.connect(_tenant_changed, sender=Tenant, dispatch_uid="live-tenant-saved")
    user_logged_out.connect(_logged_out, dispatch_uid="live-logged-out")
    post_delete.connect(_workload_deleted, sender=Workload, dispatch_uid="live-workload-deleted")
