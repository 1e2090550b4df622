"""The live-stream contract: who opens every WebSocket route, and that losing access closes what is open.

Each row of STREAMS is one route of `frontend.routing` with a path for a
tenant-A object (or an operator's). The generic tests hold every row to
the same promises, through a browser session and through an API token:

- anonymous connections close 4401, and whoever may not watch closes 4404,
  exactly as for an object that does not exist;
- `dual` (admin of tenants A and B, with a token bound to each) watches
  tenant A with its session and its A token; its B token closes 4404;
- once tenant A is deactivated, or a member removed from it, their sessions
  close 4404 and their tokens 4401 on connect, and streams they had open
  close 4403 at once (the access-change announcement, not the backstop);
- and a meta-test fails when a WebSocket route has no row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async

from frontend.routing import websocket_urlpatterns
from jobs.models import Workload
from tests.api.test_contract import LOSS, _dual, _user
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


@dataclass(frozen=True)
class Stream:
    """One WebSocket route: its path for tenant A's running workload (or for operators), and who may watch."""

    name: str
    path: Callable[[Workload], str]
    operators_only: bool = False


STREAMS = [
    Stream("logs", lambda w: f"/ws/workloads/{w.pk}/logs/?tail=0"),
    Stream("workload-metrics", lambda w: f"/ws/workloads/{w.pk}/metrics/"),
    Stream("events", lambda w: "/ws/t/tenant-a/events/"),
    Stream("node-metrics", lambda w: "/ws/nodes/n1/metrics/", operators_only=True),
    Stream("cluster", lambda w: "/ws/cluster/", operators_only=True),
]
BY_NAME = {stream.name: stream for stream in STREAMS}
TENANT_STREAMS = [s.name for s in STREAMS if not s.operators_only]
STREAMED = None  # the close code of a stream that opened and streams


def _workload(world: World) -> Workload:
    workload = _running(world, replicas=1)
    add_node(world, "n2", gpus=1)  # n1 exists: _running put the workload there
    return workload


async def _connect(path: str, credentials: dict[str, Any]) -> int | None:
    """Open `path`; return the code it closed with right away, or STREAMED once its first message came."""
    stream, connected, detail = await open_stream(path, **credentials)
    assert connected, f"the handshake of {path} was refused ({detail})"
    output = await stream.receive_output(timeout=5)
    code = output.get("code") if output["type"] == "websocket.close" else STREAMED
    await stream.disconnect()
    return code


def connect(path: str, credentials: dict[str, Any]) -> int | None:
    return async_to_sync(_connect)(path, credentials)


def _session(user: Any) -> dict[str, Any]:
    return {"headers": session_headers(user)}


def _token(secret: str) -> dict[str, Any]:
    return {"subprotocols": bearer_protocols(secret)}


@pytest.mark.parametrize("name", [s.name for s in STREAMS])
def test_who_opens_each_stream(world: World, name: str) -> None:
    stream = BY_NAME[name]
    path = stream.path(_workload(world))
    dual = _dual(world)
    tenant_code = 4404 if stream.operators_only else STREAMED
    expected = {
        "anonymous": ({"headers": [ORIGIN]}, 4401),
        "viewer_a session": (_session(world.viewer_a), tenant_code),
        "dual session": (_session(dual), tenant_code),
        "dual's token bound to A": (_token(token_for(dual, world.tenant_a, "admin")), tenant_code),
        "dual's token bound to B": (_token(token_for(dual, world.tenant_b, "admin")), 4404),
        "outsider session": (_session(world.admin_b), 4404),
        "operator session": (_session(world.operator), STREAMED),
        "operator token": (_token(token_for(world.operator, None, "operator")), STREAMED),
    }
    got = {who: connect(path, credentials) for who, (credentials, _) in expected.items()}
    assert got == {who: code for who, (_, code) in expected.items()}


@pytest.mark.parametrize("scenario", sorted(LOSS))
@pytest.mark.parametrize("name", TENANT_STREAMS)
def test_a_deactivated_tenant_or_a_removed_member_opens_no_stream(world: World, name: str, scenario: str) -> None:
    path = BY_NAME[name].path(_workload(world))
    lose, personas = LOSS[scenario]
    secrets = {persona: token_for(_user(world, persona), world.tenant_a, "viewer") for persona in personas}
    lose(world)
    for persona in personas:
        assert connect(path, _session(_user(world, persona))) == 4404, persona
        assert connect(path, _token(secrets[persona])) == 4401, persona
    if scenario == "deactivated":
        assert connect(path, _session(world.operator)) is STREAMED, "operators still watch a deactivated tenant"


@pytest.mark.parametrize("scenario", sorted(LOSS))
@pytest.mark.parametrize("name", TENANT_STREAMS)
def test_losing_the_tenant_closes_open_streams_at_once(world: World, name: str, scenario: str, settings: Any) -> None:
    """Every stream a lost persona had open, by session or by token, closes with 4403 within seconds; the
    backstop re-check is an hour away, so the access-change announcement is what closes them."""
    settings.LIVE_RECHECK_SECONDS = 3600
    path = BY_NAME[name].path(_workload(world))
    lose, personas = LOSS[scenario]
    credentials = [_session(_user(world, p)) for p in personas]
    credentials += [_token(token_for(_user(world, p), world.tenant_a, "viewer")) for p in personas]

    async def scenario_run() -> list[int | None]:
        opened = []
        for each in credentials:
            stream, connected, _ = await open_stream(path, **each)
            assert connected
            await receive(stream)
            opened.append(stream)
        await database_sync_to_async(lose)(world)
        codes = [await close_code(stream, timeout=5) for stream in opened]
        for stream in opened:
            await stream.disconnect()
        return codes

    assert async_to_sync(scenario_run)() == [4403] * len(credentials)


def test_every_websocket_route_has_a_row(world: World) -> None:
    """Fails naming each WebSocket route that no row of STREAMS opens."""
    workload = _workload(world)
    paths = [stream.path(workload).split("?")[0].lstrip("/") for stream in STREAMS]
    uncovered = [str(p.pattern) for p in websocket_urlpatterns if not any(p.pattern.match(path) for path in paths)]
    assert not uncovered, f"WebSocket routes without an access contract: {uncovered}"
    assert len(websocket_urlpatterns) >= 5
