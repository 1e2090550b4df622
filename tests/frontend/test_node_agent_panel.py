"""The Agent panel of an operator's node page: join tokens shown once, the joined agent, revoking it."""

from __future__ import annotations

import re

from django.test import Client
from rest_framework.test import APIClient

from inventory.choices import NodeState
from inventory.models import Node, NodeCredential, NodeJoinToken
from inventory.services import agents
from tenants.context import Actor
from tenants.models import AuditEvent
from tests.conftest import PASSWORD, World
from tests.frontend.test_pages import logged_in
from tests.inventory.factories import make_node

PAGE = "/ops/nodes/gpu-a/"
JOIN = {"action": "join-token"}


def docker_node(world: World, state: NodeState = NodeState.REGISTERED) -> Node:
    return make_node(Actor(user=world.operator), world.pool, name="gpu-a", state=state, runtime="docker")


def panel(page: str) -> str:
    return page.split('id="node-agent"')[1].split("</section>")[0]


def shown_token(page: str) -> str:
    match = re.search(r'value="(gpcj_[^"]+)" id="join-secret"', page)
    assert match is not None, "the page shows the new token"
    return match.group(1)


def join(token: str, host: str = "host-1") -> int:
    return APIClient().post("/api/v1/agent/join", {"token": token, "hostname": host}, format="json").status_code


def test_operator_sees_the_panel_before_any_agent_joined(world: World) -> None:
    docker_node(world)
    section = panel(logged_in("operator").get(PAGE).content.decode())
    assert "No agent has joined yet." in section
    assert 'id="action-join-token"' in section and 'value="join-token"' in section
    assert 'id="action-revoke-agent"' not in section, "nothing to revoke yet"


def test_a_join_token_is_shown_once_uncached_and_joins_the_host(world: World) -> None:
    docker_node(world)
    client = logged_in("operator")
    response = client.post(PAGE, JOIN)
    assert response.status_code == 200, "rendered in the answer itself: no redirect, nothing in the session"
    assert "no-store" in response["Cache-Control"]
    page = response.content.decode()
    token = shown_token(page)
    issued = panel(page).split('id="join-token"')[1].split("</article>")[0]
    assert f'value="gpucloud agent join http://testserver {token}"' in issued
    assert "shown only once, works once" in issued
    expires = NodeJoinToken.objects.get(node__name="gpu-a").expires_at
    assert f"{expires:%Y-%m-%d %H:%M} UTC" in issued
    assert token not in str(dict(client.session)), "the token is never kept in the session"

    assert token not in client.get(PAGE).content.decode(), "a second look does not show it again"
    assert join(token) == 201
    assert join(token) == 403, "a join token works once"


def test_the_panel_shows_the_joined_agent_and_revoking_cuts_it_off(world: World) -> None:
    node = docker_node(world)
    assert join(agents.issue_join_token(actor=Actor(user=world.operator), node=node).secret, "rack7-host") == 201
    client = logged_in("operator")
    section = panel(client.get(PAGE).content.decode())
    assert "Joined from host <code>rack7-host</code>" in section and "last seen" in section
    assert 'id="action-revoke-agent"' in section and 'name="revoke-agent-reason"' in section

    response = client.post(PAGE, {"action": "revoke-agent", "revoke-agent-reason": "host sold"})
    assert response.status_code == 302 and response["Location"] == PAGE
    assert not NodeCredential.objects.filter(node=node, revoked_at__isnull=True).exists()
    assert NodeCredential.objects.get(node=node).revoked_reason == "host sold"
    assert AuditEvent.all_tenants.filter(action="node.revoke_agent", actor_label="operator").exists()
    page = client.get(PAGE).content.decode()
    assert "Node gpu-a: agent revoked" in page
    assert "No agent has joined yet." in panel(page) and 'id="action-revoke-agent"' not in panel(page)


def test_a_retired_node_offers_no_token_and_a_stale_page_gets_409(world: World) -> None:
    docker_node(world, NodeState.RETIRED)
    client = logged_in("operator")
    section = panel(client.get(PAGE).content.decode())
    assert 'id="action-join-token"' not in section and "A retired node cannot be joined." in section
    response = client.post(PAGE, JOIN)
    assert response.status_code == 409
    conflict = response.content.decode().split('id="conflict"')[1].split("</div>")[0]
    assert "Create join token refused." in conflict and "A retired node cannot be joined." in conflict
    assert "<strong>retired</strong> now" in conflict
    assert not NodeJoinToken.objects.exists()


def test_a_simulated_node_has_no_agent_to_join(world: World) -> None:
    make_node(Actor(user=world.operator), world.pool, name="sim-1")
    client = logged_in("operator")
    section = panel(client.get("/ops/nodes/sim-1/").content.decode())
    assert "A simulated node has no agent to join." in section
    assert "<button" not in section and "<form" not in section
    response = client.post("/ops/nodes/sim-1/", JOIN)
    assert response.status_code == 409 and "Simulated nodes have no agent to join." in response.content.decode()
    assert not NodeJoinToken.objects.exists()


def test_tenant_users_can_neither_see_the_panel_nor_issue_or_revoke(world: World) -> None:
    node = docker_node(world)
    assert join(agents.issue_join_token(actor=Actor(user=world.operator), node=node).secret) == 201
    before = NodeJoinToken.objects.count()
    for username in ("admin_a", "admin_b", "member_a"):
        client = logged_in(username)
        assert client.get(PAGE).status_code == 404, username
        assert client.post(PAGE, JOIN).status_code == 404, username
        assert client.post(PAGE, {"action": "revoke-agent"}).status_code == 404, username
    assert NodeJoinToken.objects.count() == before
    assert NodeCredential.objects.filter(node=node, revoked_at__isnull=True).exists()


def test_issuing_a_token_needs_the_csrf_token(world: World) -> None:
    docker_node(world)
    client = Client(enforce_csrf_checks=True)
    assert client.login(username="operator", password=PASSWORD)
    page = client.get(PAGE).content.decode()
    assert client.post(PAGE, JOIN).status_code == 403, "the CSRF cookie alone is not enough"
    assert not NodeJoinToken.objects.exists()
    csrf = panel(page).split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
    response = client.post(PAGE, {**JOIN, "csrfmiddlewaretoken": csrf})
    assert response.status_code == 200 and shown_token(response.content.decode())
    assert NodeJoinToken.objects.count() == 1
