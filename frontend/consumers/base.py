"""What every live stream does the same way: connect in a fixed order, cap connections, lose access on time.

Connect order: accept (with subprotocol `gpucloud.v1` when offered) ->
authenticated? (else 4401) -> parameters (else 4400) -> a connection slot
(else 4429) -> join the user's access group -> authorize from the database
(else 4404, the same for "missing" and "not yours") -> the stream's own
`start`: join its groups FIRST, then read its snapshot, so whatever is
stored between the two arrives as a message (and is deduplicated) instead
of falling in between.

While open, the connection re-checks its principal and its object when
an access change is announced to its user, when its token or session
expires, and every LIVE_RECHECK_SECONDS as a backstop; losing access
closes it with 4403.
"""

from __future__ import annotations

import asyncio
import logging
import random
from datetime import datetime
from typing import Any, ClassVar
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.utils import timezone

from common.live_layer import LIVE_ALIAS, access_group
from frontend.consumers.auth import PROTOCOL, Access, Principal, current_access
from frontend.consumers.limits import acquire_slot, refresh_slot, release_slot
from tenants.context import Actor

log = logging.getLogger(__name__)

BAD_PARAMETERS = 4400
NOT_AUTHENTICATED = 4401
REVOKED = 4403
NOT_FOUND = 4404
TOO_MANY_CONNECTIONS = 4429


class BadParameter(ValueError):
    """A query parameter breaks its rule; the message names the field and the rule."""


def query_params(scope: dict[str, Any]) -> dict[str, str]:
    """Return the query string's parameters (the last value of each)."""
    parsed = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    return {name: values[-1] for name, values in parsed.items()}


def int_param(params: dict[str, str], name: str, *, default: int | None, minimum: int, maximum: int) -> int | None:
    """Return query parameter `name` as an integer in [minimum, maximum], `default` when absent; raises BadParameter."""
    raw = params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not minimum <= int(raw) <= maximum:
        raise BadParameter(f"{name}: must be an integer from {minimum} to {maximum}")
    return int(raw)


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Base of the live streams. Subclasses implement `parse`, `authorize` and `start`."""

    channel_layer_alias = LIVE_ALIAS
    operators_only: ClassVar[bool] = False

    principal: Principal | None = None
    actor: Actor | None = None
    _slot: int | None = None
    _closed = False
    _joined: set[str]
    _tasks: list[asyncio.Task[None]]

    # --- what subclasses implement ----------------------------------------------------------

    def parse(self, route: dict[str, Any], params: dict[str, str]) -> None:
        """Read the route and query parameters onto the consumer; raises BadParameter."""

    def authorize(self, actor: Actor) -> bool:
        """Return whether `actor` may watch this stream, loading what it needs; runs in a database thread."""
        raise NotImplementedError

    async def start(self) -> None:
        """Join the stream's groups, then send its snapshot."""
        raise NotImplementedError

    # --- connect and close --------------------------------------------------------------------

    async def connect(self) -> None:
        self._joined = set()
        self._tasks = []
        offered = self.scope.get("subprotocols") or []
        await self.accept(subprotocol=PROTOCOL if PROTOCOL in offered else None)
        self.principal = self.scope.get("live_principal")
        if self.principal is None:
            await self.close_with(NOT_AUTHENTICATED, "not authenticated")
            return
        try:
            self.parse(self.scope["url_route"]["kwargs"], query_params(self.scope))
        except BadParameter as error:
            await self.close_with(BAD_PARAMETERS, str(error))
            return
        self._slot = await sync_to_async(acquire_slot)(self.principal.user_id, self.channel_name)
        if self._slot is None:
            await self.close_with(TOO_MANY_CONNECTIONS, "too many live connections for this user")
            return
        # The access group before the check: a revocation committed after the check is then announced to us.
        await self.join(access_group(self.principal.user_id))
        access = await database_sync_to_async(self._access_now)()
        if access is None:
            await self.close_with(NOT_FOUND, "not found")
            return
        await self.start()
        self._tasks.append(asyncio.create_task(self._watch(access.expires_at)))

    async def disconnect(self, code: int) -> None:
        self._closed = True
        # A client gone before `connect` ran has neither.
        for task in getattr(self, "_tasks", []):
            task.cancel()
        for group in getattr(self, "_joined", set()):
            await self.channel_layer.group_discard(group, self.channel_name)
        if self._slot is not None and self.principal is not None:
            await sync_to_async(release_slot)(self.principal.user_id, self._slot, self.channel_name)

    async def close_with(self, code: int, reason: str) -> None:
        """Close the connection with `code` once; nothing is sent after it."""
        if not self._closed:
            self._closed = True
            await self.close(code=code, reason=reason)

    async def emit(self, message: dict[str, Any]) -> None:
        """Send one protocol message, unless the connection is closing or the client is gone."""
        if self._closed:
            return
        try:
            await self.send_json(message)
        except (OSError, RuntimeError):
            # The client left while a group message was on its way: the server refuses sends
            # after a disconnect (uvicorn raises ClientDisconnected or RuntimeError), and the
            # disconnect itself is next in this consumer's queue.
            self._closed = True

    async def join(self, group: str) -> None:
        await self.channel_layer.group_add(group, self.channel_name)
        self._joined.add(group)

    async def leave(self, group: str) -> None:
        if group in self._joined:
            self._joined.discard(group)
            await self.channel_layer.group_discard(group, self.channel_name)

    # --- access -------------------------------------------------------------------------------

    def _access_now(self) -> Access | None:
        assert self.principal is not None
        access = current_access(self.principal)
        if access is None:
            return None
        if self.operators_only and not access.actor.is_operator:
            return None
        if not self.authorize(access.actor):
            return None
        self.actor = access.actor
        return access

    async def recheck(self) -> datetime | None:
        """Re-check access from the database; close with 4403 when it is gone. Return the new expiry."""
        access = await database_sync_to_async(self._access_now)()
        if access is None:
            await self.close_with(REVOKED, "access revoked")
            return None
        return access.expires_at

    async def access_changed(self, event: dict[str, Any]) -> None:
        await self.recheck()

    async def _watch(self, expires_at: datetime | None) -> None:
        """Re-check at expiry and every LIVE_RECHECK_SECONDS (the first one jittered, so connections spread out)."""
        period = float(settings.LIVE_RECHECK_SECONDS)
        next_backstop = period * random.uniform(0.5, 1.0)  # noqa: S311 -- spreading load, not security
        while not self._closed:
            wait = next_backstop
            if expires_at is not None:
                wait = min(wait, max((expires_at - timezone.now()).total_seconds(), 0.0) + 0.05)
            await asyncio.sleep(wait)
            try:
                expires_at = await self.recheck()
                if self._slot is not None and self.principal is not None and not self._closed:
                    await sync_to_async(refresh_slot)(self.principal.user_id, self._slot, self.channel_name)
            except Exception:
                log.exception("live stream re-check failed; trying again next period")
            next_backstop = period
