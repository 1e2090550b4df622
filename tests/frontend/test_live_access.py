"""Who may open a live stream, and how fast they lose it: authentication, Origin, tenants, roles, revocation, caps.

Personas from tests/conftest.py: tenant A's admin, member and viewer, tenant
B's admin (the outsider), the operator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib import import_module
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import logout
from django.http import HttpRequest

from jobs.models import Workload
from tenants.context import Actor
from tenants.models import ApiToken, Membership
from tenants.scoping import tenant_scope
from tenants.services.members import remove_member
from tenants.services.tenants import update_tenant
from tenants.services.tokens import revoke_token
from tests.conftest import World
from tests.frontend import live
from tests.frontend.live import (
    ORIGIN,
    bearer_protocols,
    close_code,
    open_stream,
    receive,
    session_headers,
    token_for,
)
from tests.jobs.factories import add_node
from tests.jobs.test_logs import _running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_live_layer")]
fresh_live_layer = live.fresh_live_layer

FOREIGN = (b"origin", b"https://evil.example")


def _logs(workload: Workload) -> str:
    return f"/ws/workloads/{workload.pk}/logs/?tail=0"


async def _opens(path: str, **kwargs: Any) -> tuple[bool, Any, int | None]:
    """Open a stream; return (handshake accepted, subprotocol, close code or None when it streams)."""
    stream, connected, detail = await open_stream(path, **kwargs)
    if not connected:
        return False, detail, None
    output = await stream.receive_output(timeout=5)
    code = output.get("code") if output["type"] == "websocket.close" else None
    await stream.disconnect()
    return True, detail, code


def opens(path: str, **kwargs: Any) -> tuple[bool, Any, int | None]:
    return async_to_sync(_opens)(path, **kwargs)


# --- authentication and Origin ------------------------------------------------------------------


def test_a_session_cookie_from_the_console_origin_streams(world: World) -> None:
    workload = _running(world, replicas=1)
    assert opens(_logs(workload), headers=session_headers(world.viewer_a)) == (True, None, None)


@pytest.mark.parametrize("origin", [None, FOREIGN])
def test_a_session_cookie_without_an_allowed_origin_is_refused_at_the_handshake(world: World, origin: Any) -> None:
    workload = _running(world, replicas=1)
    accepted, _, _ = opens(_logs(workload), headers=session_headers(world.admin_a, origin=origin))
    assert not accepted


def test_a_token_in_the_authorization_header_streams_without_an_origin(world: World) -> None:
    workload = _running(world, replicas=1)
    secret = token_for(world.member_a, world.tenant_a, "member")
    assert opens(_logs(workload), headers=[(b"authorization", f"Bearer {secret}".encode())]) == (True, None, None)


def test_a_token_as_subprotocol_is_accepted_with_gpucloud_v1_and_never_echoed(world: World) -> None:
    workload = _running(world, replicas=1)
    secret = token_for(world.viewer_a, world.tenant_a, "viewer")
    assert opens(_logs(workload), subprotocols=bearer_protocols(secret)) == (True, "gpucloud.v1", None)
    assert opens(_logs(workload), subprotocols=bearer_protocols(secret), headers=[ORIGIN])[2] is None


def test_a_token_from_a_foreign_origin_is_refused_at_the_handshake(world: World) -> None:
    workload = _running(world, replicas=1)
    secret = token_for(world.member_a, world.tenant_a, "member")
    accepted, _, _ = opens(_logs(workload), subprotocols=bearer_protocols(secret), headers=[FOREIGN])
    assert not accepted


def test_no_credentials_a_token_in_the_url_or_a_bad_token_close_with_4401(world: World) -> None:
    workload = _running(world, replicas=1)
    secret = token_for(world.member_a, world.tenant_a, "member")
    assert opens(_logs(workload), headers=[ORIGIN])[2] == 4401
    assert opens(f"{_logs(workload)}&token={secret}", headers=[ORIGIN])[2] == 4401
    assert opens(f"{_logs(workload)}&access_token={secret}", headers=[ORIGIN])[2] == 4401
    assert opens(_logs(workload), subprotocols=bearer_protocols(secret + "x"))[2] == 4401
    revoke_token(actor=Actor(user=world.member_a), token=ApiToken.all_tenants.get(user=world.member_a))
    assert opens(_logs(workload), subprotocols=bearer_protocols(secret))[2] == 4401


# --- tenants and roles -------------------------------------------------------------------------------


def test_another_tenants_workload_closes_4404_as_a_missing_one_does(world: World) -> None:
    workload = _running(world, replicas=1)
    outsider = session_headers(world.admin_b)
    assert opens(_logs(workload), headers=outsider)[2] == 4404
    assert opens(f"/ws/workloads/{workload.pk}/metrics/", headers=outsider)[2] == 4404
    assert opens("/ws/workloads/999999/logs/", headers=session_headers(world.admin_a))[2] == 4404
    assert opens("/ws/t/tenant-a/events/", headers=outsider)[2] == 4404
    assert opens("/ws/t/no-such-tenant/events/", headers=session_headers(world.admin_a))[2] == 4404
    assert opens("/ws/t/tenant-a/events/?project=beta", headers=session_headers(world.admin_a))[2] == 4404


def test_a_token_reaches_only_its_own_tenant(world: World) -> None:
    """admin_b is also a viewer in tenant A: their session watches A's workload, their tenant-B token does not."""
    Membership.all_tenants.create(tenant=world.tenant_a, user=world.admin_b, role="viewer")
    workload = _running(world, replicas=1)
    assert opens(_logs(workload), headers=session_headers(world.admin_b))[2] is None
    secret = token_for(world.admin_b, world.tenant_b, "admin")
    assert opens(_logs(workload), subprotocols=bearer_protocols(secret))[2] == 4404
    assert opens("/ws/t/tenant-a/events/", subprotocols=bearer_protocols(secret))[2] == 4404


@pytest.mark.parametrize("path", ["/ws/cluster/", "/ws/nodes/n1/metrics/"])
def test_operator_streams_are_for_operators_only(world: World, path: str) -> None:
    add_node(world, "n1", gpus=2)
    assert opens(path, headers=session_headers(world.operator))[2] is None
    assert opens(path, headers=session_headers(world.admin_a))[2] == 4404
    operator_token = token_for(world.operator, None, "operator")
    assert opens(path, subprotocols=bearer_protocols(operator_token))[2] is None
    # An operator's token with a tenant role acts with that role only.
    Membership.all_tenants.create(tenant=world.tenant_a, user=world.operator, role="admin")
    tenant_token = token_for(world.operator, world.tenant_a, "admin")
    assert opens(path, subprotocols=bearer_protocols(tenant_token))[2] == 4404
    assert opens("/ws/nodes/no-such-node/metrics/", headers=session_headers(world.operator))[2] == 4404


# --- revocation ------------------------------------------------------------------------------------


def _revoked_within(path: str, revoke: Callable[[], object], seconds: float = 5, **kwargs: Any) -> float:
    """Open `path`, read its first message, run `revoke`; return how long until the stream closed with 4403."""

    async def scenario() -> float:
        stream, connected, _ = await open_stream(path, **kwargs)
        assert connected
        await receive(stream)
        started = time.monotonic()
        await database_sync_to_async(revoke)()
        assert await close_code(stream, timeout=seconds) == 4403
        took = time.monotonic() - started
        await stream.disconnect()
        return took

    return async_to_sync(scenario)()


def test_removing_a_membership_closes_the_members_streams(world: World) -> None:
    workload = _running(world, replicas=1)
    membership = Membership.all_tenants.get(user=world.viewer_a, tenant=world.tenant_a)

    def remove() -> None:
        with tenant_scope(world.tenant_a):
            remove_member(actor=Actor(user=world.admin_a), membership=membership)

    assert _revoked_within(_logs(workload), remove, headers=session_headers(world.viewer_a)) < 5


def test_revoking_a_token_closes_its_streams(world: World) -> None:
    secret = token_for(world.member_a, world.tenant_a, "member")
    token = ApiToken.all_tenants.get(user=world.member_a)
    took = _revoked_within(
        "/ws/t/tenant-a/events/",
        lambda: revoke_token(actor=Actor(user=world.member_a), token=token),
        subprotocols=bearer_protocols(secret),
    )
    assert took < 5


def test_logging_out_closes_that_sessions_streams(world: World) -> None:
    headers = session_headers(world.admin_a)
    key = dict(headers)[b"cookie"].decode().split("=", 1)[1]

    def log_out() -> None:
        request = HttpRequest()
        request.session = import_module(settings.SESSION_ENGINE).SessionStore(key)
        request.user = world.admin_a
        logout(request)

    assert _revoked_within("/ws/t/tenant-a/events/", log_out, headers=headers) < 5


def test_deactivating_a_user_or_their_tenant_closes_their_streams(world: World) -> None:
    def deactivate_user() -> None:
        world.member_a.is_active = False
        world.member_a.save(update_fields=["is_active"])

    assert _revoked_within("/ws/t/tenant-a/events/", deactivate_user, headers=session_headers(world.member_a)) < 5
    tenant_off = lambda: update_tenant(actor=Actor(user=world.operator), tenant=world.tenant_a, is_active=False)  # noqa: E731
    assert _revoked_within("/ws/t/tenant-a/events/", tenant_off, headers=session_headers(world.viewer_a)) < 5


def test_deleting_the_workload_closes_its_streams(world: World) -> None:
    workload = _running(world, replicas=1)

    def delete() -> None:
        Workload.all_tenants.filter(pk=workload.pk).delete()

    assert _revoked_within(_logs(workload), delete, headers=session_headers(world.admin_a)) < 5


def test_an_expiring_token_closes_its_stream_when_it_expires(world: World) -> None:
    from datetime import timedelta

    from django.utils import timezone

    secret = token_for(world.member_a, world.tenant_a, "member")
    ApiToken.all_tenants.filter(user=world.member_a).update(expires_at=timezone.now() + timedelta(seconds=1.5))

    async def scenario() -> None:
        stream, _, _ = await open_stream("/ws/t/tenant-a/events/", subprotocols=bearer_protocols(secret))
        assert (await receive(stream))["type"] == "snapshot"
        assert await close_code(stream, timeout=5) == 4403
        await stream.disconnect()

    async_to_sync(scenario)()


# --- connection cap --------------------------------------------------------------------------------


def test_connections_over_the_cap_close_with_4429_until_one_closes(world: World, settings: Any) -> None:
    settings.LIVE_MAX_CONNECTIONS_PER_USER = 2
    headers = session_headers(world.member_a)

    async def scenario() -> None:
        first, _, _ = await open_stream("/ws/t/tenant-a/events/", headers=headers)
        second, _, _ = await open_stream("/ws/t/tenant-a/events/", headers=headers)
        assert (await receive(first))["type"] == (await receive(second))["type"] == "snapshot"
        third, _, _ = await open_stream("/ws/t/tenant-a/events/", headers=headers)
        assert await close_code(third) == 4429
        await third.disconnect()
        await first.disconnect()
        fourth, _, _ = await open_stream("/ws/t/tenant-a/events/", headers=headers)
        assert (await receive(fourth))["type"] == "snapshot"
        await second.disconnect()
        await fourth.disconnect()

    async_to_sync(scenario)()
    # Another user's connections are counted apart.
    assert opens("/ws/t/tenant-a/events/", headers=session_headers(world.viewer_a))[2] is None
