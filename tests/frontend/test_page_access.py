"""The page contract: who opens every page of the console, through Django's test client.

Each row of PAGES is one route of the web UI with a URL for a tenant-A
object and, for pages that write, a form post to try. The generic tests
hold every row to the same promises:

- anonymous visitors are sent to log in, from tenant and operator pages;
- an outsider (tenant B's admin) gets 404 on every tenant-A page, reading
  or posting, and nothing changes; operator pages are 404 for non-operators;
- inside tenant A, below a page's least role the answer is 403, at or above
  it the page opens; `dual` (admin of tenants A and B) acts there as admin;
- an API token opens no page, whichever tenant it is bound to: pages are
  for browser sessions;
- once tenant A is deactivated, or a member removed from it, their sessions
  get 404 on every tenant-A page, reading or posting, and the home page no
  longer offers it; operators still open it;
- and a meta-test fails when a route of the web UI has no row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from jobs.models import AllowedImage
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Membership
from tenants.scoping import tenant_scope
from tenants.services.invitations import invite_member
from tenants.services.tokens import create_token
from tests.accounting import budget_factories
from tests.api.test_contract import (
    LOSS,
    RANK,
    _a_only_pool,
    _dual,
    _membership,
    _preset,
    _price,
    _project_quota,
    _ready_node,
    _state,
    _user,
    _volume_world,
    _workload_world,
)
from tests.conftest import World
from tests.notifications import factories as notification_factories

Url = Callable[[World, dict[str, Any]], str]
Form = Callable[[World, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class PageRoute:
    """One route of the web UI: where it is for tenant A, who may open it, and a write to try on it."""

    name: str
    url: Url
    # Tenant pages: the least role that opens them. None: an operator page (404 for everyone else).
    minimum: Role | None
    post: Form | None = None
    get: bool = True  # False for routes that only take POST
    setup: Callable[[World], dict[str, Any]] = lambda world: {}
    # Pages whose GET answers something other than 200 by design, for those allowed.
    opened_status: int = 200
    # Routes that only take POST: the least role whose post succeeds, where the object asks more than the page.
    post_role: Role | None = None

    @property
    def tenant_page(self) -> bool:
        return self.minimum is not None


def _t(path: str) -> Url:
    return lambda world, extra: f"/t/tenant-a/{path.format(**extra)}"


def _o(path: str) -> Url:
    return lambda world, extra: f"/ops/{path.format(**extra)}"


def _image(world: World) -> dict[str, Any]:
    image, _ = AllowedImage.objects.get_or_create(tenant=world.tenant_a, pattern="busybox:*")
    return {"pk": image.pk}


def _invitation(world: World) -> dict[str, Any]:
    with tenant_scope(world.tenant_a):
        issued = invite_member(actor=Actor(user=world.admin_a), tenant=world.tenant_a, username="guest")
    return {"pk": issued.invitation.pk}


def _colleagues_token(world: World) -> dict[str, Any]:
    """A token of a member of tenant A who is none of the personas."""
    colleague = User.objects.create_user("colleague", "colleague@example.com", "x")
    Membership.all_tenants.create(tenant=world.tenant_a, user=colleague, role="member")
    issued = create_token(
        actor=Actor(user=colleague), tenant=world.tenant_a, name="c", role="member", expires_in_days=1
    )
    return {"pk": issued.token.pk}


PAGES = [
    PageRoute("overview", _t(""), Role.VIEWER),
    PageRoute("projects", _t("projects/"), Role.VIEWER, post=lambda w, x: {"new-slug": "sneaky", "new-name": "S"}),
    PageRoute("project_edit", _t("projects/alpha/"), Role.ADMIN, post=lambda w, x: {"delete": "1"}),
    PageRoute(
        "members", _t("members/"), Role.VIEWER, post=lambda w, x: {"invite-username": "mole", "invite-role": "admin"}
    ),
    PageRoute(
        "member_edit",
        _t("members/{pk}/"),
        Role.ADMIN,
        setup=_membership,
        post=lambda w, x: {"remove": "1"},
        get=False,
    ),
    PageRoute(
        "invitation_withdraw",
        _t("members/invitations/{pk}/withdraw/"),
        Role.ADMIN,
        setup=_invitation,
        post=lambda w, x: {},
        get=False,
    ),
    PageRoute(
        "quotas",
        _t("quotas/"),
        Role.VIEWER,
        post=lambda w, x: {"action": "project-quota", "pq-project": "alpha", "pq-pool": "shared", "pq-limit": 1},
    ),
    PageRoute(
        "quota_edit",
        _t("quotas/pq/{pk}/"),
        Role.ADMIN,
        setup=_project_quota,
        post=lambda w, x: {"delete": "1"},
        get=False,
    ),
    PageRoute(
        "budgets",
        _t("budgets/"),
        Role.VIEWER,
        setup=budget_factories.budget_world,
        post=lambda w, x: {"action": "budget", "project": "alpha", "unit": "money", "amount": "9"},
    ),
    PageRoute(
        "budget_edit",
        _t("budgets/{pk}/"),
        Role.ADMIN,
        setup=budget_factories.budget_world,
        post=lambda w, x: {"action": "delete"},
        get=False,
    ),
    PageRoute(
        "requests",
        _t("requests/"),
        Role.VIEWER,
        setup=budget_factories.request_world,
        post=lambda w, x: {"action": "ask", "kind": "budget", "project": "alpha", "reason": "sneaky"},
    ),
    PageRoute(
        "request_decide",
        _t("requests/{pk}/cancel/"),
        Role.MEMBER,  # the requester (member_a) withdraws it; deciders may too
        setup=budget_factories.request_world,
        post=lambda w, x: {},
        get=False,
    ),
    PageRoute(
        "tokens", _t("tokens/"), Role.VIEWER, post=lambda w, x: {"name": "x", "role": "viewer", "expires_in_days": 7}
    ),
    PageRoute(
        "token_revoke",
        _t("tokens/{pk}/revoke/"),
        Role.VIEWER,
        setup=_colleagues_token,
        post=lambda w, x: {},
        get=False,
        post_role=Role.ADMIN,  # anyone revokes their own tokens; another member's, the tenant's admins
    ),
    PageRoute("audit", _t("audit/"), Role.ADMIN),
    PageRoute("audit_export", _t("audit/export.csv"), Role.ADMIN),
    PageRoute("usage", _t("usage/"), Role.ADMIN),
    PageRoute("usage_export", _t("usage/export.csv"), Role.ADMIN),
    PageRoute("statement", _t("usage/statement/"), Role.ADMIN),
    PageRoute("presets", _t("presets/"), Role.ADMIN, setup=_preset),
    PageRoute("preset_edit", _t("presets/{pk}/"), Role.ADMIN, setup=_preset, post=lambda w, x: {"delete": "1"}),
    PageRoute("queue", _t("queue/"), Role.VIEWER),
    PageRoute("workloads", _t("workloads/"), Role.VIEWER, setup=_workload_world),
    PageRoute(
        "workload", _t("workloads/{pk}/"), Role.VIEWER, setup=_workload_world, post=lambda w, x: {"action": "cancel"}
    ),
    PageRoute(
        "launch",
        _t("launch/"),
        Role.MEMBER,
        setup=_workload_world,
        post=lambda w, x: {"kind": "job", "name": "sneaky", "project": "alpha", "pool": "shared", "image": "busybox:1"},
    ),
    PageRoute(
        "storage",
        _t("storage/"),
        Role.VIEWER,
        setup=_volume_world,
        post=lambda w, x: {"action": "create", "new-kind": "dataset", "new-name": "sneaky", "new-project": "alpha"},
    ),
    PageRoute(
        "volume",
        _t("storage/{pk}/"),
        Role.VIEWER,
        setup=_volume_world,
        post=lambda w, x: {"action": "upload", "folder": "", "up-file": SimpleUploadedFile("sneaky.txt", b"x")},
    ),
    PageRoute("volume_download", _t("storage/{pk}/download/?path=hello.txt"), Role.VIEWER, setup=_volume_world),
    PageRoute("ops_tenants", _o("tenants/"), None, post=lambda w, x: {"toggle": "tenant-a"}),
    PageRoute("ops_pools", _o("pools/"), None),
    PageRoute("ops_pool_edit", _o("pools/shared/"), None, post=lambda w, x: {"delete": "1"}, get=False),
    PageRoute("ops_nodes", _o("nodes/"), None, setup=_ready_node),
    PageRoute("ops_node", _o("nodes/n1/"), None, setup=_ready_node, post=lambda w, x: {"action": "cordon"}),
    PageRoute("ops_gpus", _o("gpus/"), None, setup=_ready_node),
    PageRoute("ops_cluster", _o("cluster/"), None, setup=_ready_node),
    PageRoute("demo_fleet", _o("cluster/demo/"), None, post=lambda w, x: {}, get=False),
    PageRoute("ops_allocation", _o("allocation/"), None),
    PageRoute("ops_images", _o("images/"), None, setup=_image),
    PageRoute("ops_usage", _o("usage/"), None),
    PageRoute("ops_requests", _o("requests/"), None),
    PageRoute("ops_usage_export", _o("usage/export.csv"), None),
    PageRoute("ops_prices", _o("prices/"), None, post=lambda w, x: {"resource": "gpu", "amount_per_hour": "1"}),
    PageRoute("ops_price_remove", _o("prices/{pk}/remove/"), None, setup=_price, post=lambda w, x: {}, get=False),
    PageRoute("ops_image_delete", _o("images/{pk}/delete/"), None, setup=_image, post=lambda w, x: {}, get=False),
    PageRoute("notification_settings", _t("notifications/"), Role.VIEWER, post=lambda w, x: {"mail-save": "1"}),
    PageRoute(
        "webhooks",
        _t("webhooks/"),
        Role.ADMIN,
        post=lambda w, x: {"add": "1", "hook-url": "https://hooks.example.com/x", "hook-kinds": ["workload.failed"]},
    ),
    PageRoute(
        "webhook_edit",
        _t("webhooks/{pk}/"),
        Role.ADMIN,
        setup=notification_factories.webhook_world,
        post=lambda w, x: {"action": "remove"},
        get=False,
    ),
    PageRoute(
        "ops_webhooks",
        _o("webhooks/"),
        None,
        post=lambda w, x: {"add": "1", "hook-url": "https://ops.example.com/x", "hook-kinds": ["node.health"]},
    ),
    PageRoute(
        "ops_webhook_edit",
        _o("webhooks/{pk}/"),
        None,
        setup=notification_factories.platform_webhook_world,
        post=lambda w, x: {"action": "rotate"},
        get=False,
    ),
]
BY_NAME = {page.name: page for page in PAGES}
# Routes every visitor may reach, held to their own tests.
PUBLIC = {
    "home": "tests/frontend/test_pages.py (home redirects to log in or to the viewer's own tenant); below",
    "login": "tests/frontend/test_pages.py (login throttling)",
    "logout": "Django's LogoutView: POST only, ends the session",
    "invitation": "tests/tenants/test_invitations.py (the one-time invitation link: its secret is the key)",
}
PERSONAS = ["viewer_a", "member_a", "admin_a", "dual", "operator"]


@dataclass
class Visit:
    """One request a test makes: method, URL and form data (None for a GET)."""

    method: str
    url: str
    data: dict[str, Any] | None = field(default=None)


def _visits(world: World, page: PageRoute, *, writes: bool = True) -> list[Visit]:
    extra = page.setup(world)
    url = page.url(world, extra)
    visits = [Visit("get", url)] if page.get else []
    if writes and page.post is not None:
        visits.append(Visit("post", url, page.post(world, extra)))
    return visits


def _open(client: Client, visit: Visit, headers: dict[str, str] | None = None) -> Any:
    if visit.method == "get":
        return client.get(visit.url, headers=headers)
    return client.post(visit.url, visit.data or {}, headers=headers)


def _session(world: World, persona: str) -> Client:
    client = Client()
    client.force_login(_user(world, persona))
    return client


def _names(predicate: Callable[[PageRoute], bool] = lambda p: True) -> list[str]:
    return [page.name for page in PAGES if predicate(page)]


@pytest.mark.parametrize("name", _names())
def test_anonymous_visitors_are_sent_to_log_in(world: World, name: str) -> None:
    for visit in _visits(world, BY_NAME[name]):
        before = _state()
        response = _open(Client(), visit)
        assert response.status_code == 302, (visit, response.status_code)
        assert response["Location"].startswith("/login/?next="), visit
        assert _state() == before


@pytest.mark.parametrize("name", _names())
def test_an_outsider_gets_404_on_every_page_and_changes_nothing(world: World, name: str) -> None:
    """admin_b administers tenant B: tenant A's pages do not exist for them, nor do operator pages."""
    outsider = _session(world, "admin_b")
    for visit in _visits(world, BY_NAME[name]):
        before = _state()
        assert _open(outsider, visit).status_code == 404, visit
        assert _state() == before, f"a refused {visit.method} changed something"


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("name", _names())
def test_each_role_opens_exactly_the_pages_of_its_rights(world: World, name: str, persona: str) -> None:
    page = BY_NAME[name]
    client = _session(world, persona)
    rank = RANK[persona]
    needed = page.post_role or page.minimum
    allowed = rank == Role.OPERATOR if needed is None else rank.at_least(needed)
    for visit in _visits(world, page, writes=not page.get):
        before = _state()
        response = _open(client, visit)
        if not allowed:
            assert response.status_code == (403 if page.tenant_page else 404), (visit, persona)
            assert _state() == before
        elif visit.method == "get":
            assert response.status_code == page.opened_status, (visit, persona, response.status_code)
        else:
            assert response.status_code in (200, 302), (visit, persona, response.status_code)


@pytest.mark.parametrize("name", _names())
def test_an_api_token_opens_no_page(world: World, name: str) -> None:
    """Pages are for browser sessions: a bearer token of either of dual's tenants, or an operator's, is no login."""
    dual = _dual(world)
    secrets = [
        create_token(actor=Actor(user=dual), tenant=tenant, name="t", role="admin", expires_in_days=1).secret
        for tenant in (world.tenant_a, world.tenant_b)
    ]
    secrets.append(
        create_token(actor=Actor(user=world.operator), tenant=None, name="o", role="operator", expires_in_days=1).secret
    )
    for visit in _visits(world, BY_NAME[name]):
        for secret in secrets:
            before = _state()
            response = _open(Client(), visit, {"Authorization": f"Bearer {secret}"})
            assert response.status_code == 302 and response["Location"].startswith("/login/"), visit
            assert _state() == before


@pytest.mark.parametrize("scenario", sorted(LOSS))
@pytest.mark.parametrize("name", _names(lambda p: p.tenant_page))
def test_a_deactivated_tenant_or_a_removed_member_gets_404_on_every_tenant_page(
    world: World, name: str, scenario: str
) -> None:
    page = BY_NAME[name]
    visits = _visits(world, page)
    lose, personas = LOSS[scenario]
    _a_only_pool(world)
    lose(world)
    for persona in personas:
        client = _session(world, persona)
        for visit in visits:
            before = _state()
            assert _open(client, visit).status_code == 404, (persona, visit)
            assert _state() == before, f"a refused {visit.method} changed something"
    if scenario == "deactivated" and page.get:
        assert _open(_session(world, "operator"), visits[0]).status_code == page.opened_status


@pytest.mark.parametrize("scenario", sorted(LOSS))
def test_the_home_page_stops_offering_a_tenant_that_is_gone(world: World, scenario: str) -> None:
    lose, personas = LOSS[scenario]
    lose(world)
    for persona in personas:
        response = _session(world, persona).get("/")
        if response.status_code == 302:  # a member of one tenant lands on it: dual, on tenant B
            assert response["Location"] == "/t/tenant-b/", persona
        else:
            assert response.status_code == 200 and "tenant-a" not in response.content.decode(), persona


def _page_route_names(patterns: list[Any], namespace: str = "") -> set[str]:
    names: set[str] = set()
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            if pattern.namespace == "frontend" or namespace:
                names |= _page_route_names(pattern.url_patterns, pattern.namespace or namespace)
            elif pattern.namespace is None and not str(pattern.pattern).startswith(("api/", "admin/")):
                names |= _page_route_names(pattern.url_patterns, namespace)
        elif isinstance(pattern, URLPattern) and namespace == "frontend" and pattern.name:
            names.add(pattern.name)
    return names


def test_every_page_route_has_a_row() -> None:
    """Fails naming each route of the web UI (namespace `frontend`) that neither PAGES nor PUBLIC holds."""
    routes = _page_route_names(get_resolver().url_patterns)
    assert {"overview", "workload", "ops_nodes", "login"} <= routes, "the meta-test sees the routes"
    missing = sorted(routes - set(BY_NAME) - set(PUBLIC))
    assert not missing, f"pages without an access contract: {missing}"
    assert not set(BY_NAME) - routes, f"rows for routes that do not exist: {sorted(set(BY_NAME) - routes)}"
