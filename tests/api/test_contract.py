"""The permission contract every API endpoint inherits.

Each row of CONTRACTS describes one endpoint: its URLs for a tenant-A
object, the payloads of its writes, and the least role each method needs.
The generic tests then hold every row to the same promises:

- anonymous callers get 401 on every method;
- a tenant admin of another tenant (the outsider) gets 404 on every method
  of a tenant-A URL, and nothing changes anywhere;
- below the required role the answer is 403, at or above it 2xx (viewers
  cannot write, members cannot administer, operators can do everything);
- and a meta-test fails when an API route has no row here.

Adding an endpoint means adding a row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.apps import apps
from django.db import transaction
from django.urls import URLPattern, URLResolver, get_resolver

from inventory.choices import NodeState
from inventory.models import Gpu, Node, NodePool
from inventory.services import register_node, transition_node
from tenants import services
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import ApiToken, AuditEvent, Membership, Project, ProjectQuota, TenantQuota
from tests.conftest import World, client_for

Urls = Callable[[World, dict[str, Any]], str]
Payload = Callable[[World, dict[str, Any]], dict[str, Any]]
PERSONAS = ["viewer_a", "member_a", "admin_a", "operator"]
RANK = {"viewer_a": Role.VIEWER, "member_a": Role.MEMBER, "admin_a": Role.ADMIN, "operator": Role.OPERATOR}


@dataclass(frozen=True)
class Contract:
    """What one API endpoint promises."""

    basename: str
    list_url: Urls
    detail_url: Urls | None
    read: Role
    write: Role = Role.ADMIN
    create: Payload | None = None
    update: Payload | None = None
    delete: bool = False
    tenant_scoped: bool = True
    setup: Callable[[World], dict[str, Any]] = lambda world: {}
    # Where an authorized write still answers something other than 2xx by design.
    authorized_status: dict[str, int] = field(default_factory=dict)
    # Detail actions (POST <detail>/<name>/) and their payloads; they need the write role.
    actions: dict[str, Payload] = field(default_factory=dict)
    # Detail reads (GET <detail><path>) by route name; they need the read role.
    reads: dict[str, str] = field(default_factory=dict)

    def operations(self) -> list[str]:
        return OPERATIONS + [f"action:{name}" for name in self.actions] + [f"read:{name}" for name in self.reads]

    def requests(self, world: World, extra: dict[str, Any]) -> list[tuple[str, str, dict[str, Any] | None]]:
        """Return (method, url, body) for every operation this endpoint offers."""
        items: list[tuple[str, str, dict[str, Any] | None]] = [("get", self.list_url(world, extra), None)]
        detail = self.detail_url(world, extra) if self.detail_url else None
        if detail:
            items.append(("get-detail", detail, None))
        if self.create:
            items.append(("post", self.list_url(world, extra), self.create(world, extra)))
        if self.update and detail:
            items.append(("patch", detail, self.update(world, extra)))
        if self.delete and detail:
            items.append(("delete", detail, None))
        for name, payload in self.actions.items():
            if detail:
                items.append((f"action:{name}", f"{detail}{name}/", payload(world, extra)))
        for name, path in self.reads.items():
            if detail:
                items.append((f"read:{name}", f"{detail}{path}", None))
        return items


def _t(path: str) -> Urls:
    return lambda world, extra: f"/api/v1/tenants/tenant-a/{path.format(**extra)}"


def _p(path: str) -> Urls:
    return lambda world, extra: f"/api/v1/{path.format(**extra)}"


def _project_quota(world: World) -> dict[str, Any]:
    second = Project.all_tenants.create(tenant=world.tenant_a, slug="second", name="Second")
    quota = ProjectQuota.all_tenants.create(
        tenant=world.tenant_a, project=world.project_a, pool=world.pool, guaranteed=2, limit=4
    )
    return {"pk": quota.pk, "second": second.slug}


def _member_token(world: World) -> dict[str, Any]:
    issued = services.create_token(
        actor=Actor(user=world.member_a), tenant=world.tenant_a, name="m", role="member", expires_in_days=1
    )
    return {"pk": issued.token.pk}


def _audit_event(world: World) -> dict[str, Any]:
    services.update_project(actor=Actor(user=world.admin_a), project=world.project_a, name="Alpha 2")
    return {"pk": AuditEvent.all_tenants.filter(tenant_id=world.tenant_a.pk).latest("id").pk}


def _ready_node(world: World) -> dict[str, Any]:
    existing = Node.objects.filter(name="n1").first()
    if existing is not None:
        return {"pk": existing.pk}
    node = register_node(
        actor=Actor(user=world.operator), name="n1", pool=world.pool, runtime="simulated", simulated_gpu_count=2
    )
    with transaction.atomic():
        transition_node(node, NodeState.PROVISIONING, actor=Actor(user=world.operator), action="node.provision")
        transition_node(node, NodeState.READY, actor=Actor(user=world.operator), action="node.ready")
    Gpu.objects.create(node=node, index=0, uuid="GPU-contract-0", model="NVIDIA H100 80GB HBM3")
    return {"pk": node.pk}


def _reason(world: World, extra: dict[str, Any]) -> dict[str, Any]:
    return {"reason": "contract test"}


def _membership(world: World) -> dict[str, Any]:
    return {"pk": Membership.all_tenants.get(user=world.member_a).pk}


def _extra_pool(world: World) -> dict[str, Any]:
    NodePool.objects.create(name="extra")
    return {"pk": world.quota_a.pk}


def _workload_world(world: World) -> dict[str, Any]:
    """Alpha has quota and a GPU node in `shared`; member_a works in alpha and has one pending workload."""
    from jobs.services import submit_workload
    from tests.jobs.factories import add_node, assign, request

    # get_or_create: test_detail_routes_exist... runs every setup on one world.
    ProjectQuota.all_tenants.get_or_create(
        tenant=world.tenant_a, project=world.project_a, pool=world.pool, defaults={"limit": 4}
    )
    if not Node.objects.filter(name="wl-node").exists():
        add_node(world, "wl-node", gpus=2)
    assign(world.member_a, world.project_a)
    workload = submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    return {"pk": workload.pk}


def _workload_body(world: World, extra: dict[str, Any]) -> dict[str, Any]:
    return {"project": "alpha", "pool": "shared", "name": "fresh", "image": "busybox:1"}


def _allowed_image(world: World) -> dict[str, Any]:
    """A pattern for tenant A (and one for tenant B, which A's people never see)."""
    from jobs.models import AllowedImage

    mine, _ = AllowedImage.objects.get_or_create(tenant=world.tenant_a, pattern="busybox:*")
    AllowedImage.objects.get_or_create(tenant=world.tenant_b, pattern="registry.b/*")
    return {"pk": mine.pk}


def _preset(world: World) -> dict[str, Any]:
    from jobs.models import LaunchPreset

    preset, _ = LaunchPreset.all_tenants.get_or_create(
        tenant=world.tenant_a, name="Notebook", defaults={"image": "busybox:1", "pool": world.pool}
    )
    return {"pk": preset.pk}


def _preset_body(world: World, extra: dict[str, Any]) -> dict[str, Any]:
    return {"name": "Fresh", "kind": "job", "image": "busybox:1", "pool": "shared"}


CONTRACTS = [
    Contract(
        basename="project",
        list_url=_t("projects/"),
        detail_url=_t("projects/alpha/"),
        read=Role.VIEWER,
        create=lambda w, x: {"slug": "fresh", "name": "Fresh"},
        update=lambda w, x: {"name": "Renamed"},
        delete=True,
    ),
    Contract(
        basename="membership",
        list_url=_t("memberships/"),
        detail_url=_t("memberships/{pk}/"),
        read=Role.VIEWER,
        setup=_membership,
        create=lambda w, x: {"username": "newcomer", "role": "viewer"},
        update=lambda w, x: {"role": "viewer"},
        delete=True,
    ),
    Contract(
        basename="tenant-quota",
        list_url=_t("quotas/"),
        detail_url=_t("quotas/{pk}/"),
        read=Role.VIEWER,
        write=Role.OPERATOR,
        setup=_extra_pool,
        create=lambda w, x: {"pool": "extra", "guaranteed": 1, "limit": 2},
        update=lambda w, x: {"limit": 20},
        delete=True,
    ),
    Contract(
        basename="project-quota",
        list_url=_t("project-quotas/"),
        detail_url=_t("project-quotas/{pk}/"),
        read=Role.VIEWER,
        setup=_project_quota,
        create=lambda w, x: {"project": x["second"], "pool": "shared", "guaranteed": 1, "limit": 2},
        update=lambda w, x: {"limit": 6},
        delete=True,
    ),
    Contract(
        basename="tenant-token",
        list_url=_t("tokens/"),
        detail_url=_t("tokens/{pk}/"),
        read=Role.ADMIN,
        setup=_member_token,
        delete=True,
    ),
    Contract(
        basename="audit-event",
        list_url=_t("audit-events/"),
        detail_url=_t("audit-events/{pk}/"),
        read=Role.ADMIN,
        setup=_audit_event,
    ),
    Contract(
        basename="tenant",
        list_url=_p("tenants/"),
        detail_url=_p("tenants/tenant-a/"),
        read=Role.VIEWER,
        write=Role.OPERATOR,
        tenant_scoped=False,
        create=lambda w, x: {"slug": "tenant-c", "name": "Tenant C"},
        update=lambda w, x: {"name": "Renamed"},
        delete=True,
        authorized_status={"delete": 409},  # tenant A still has projects
    ),
    Contract(
        basename="node-pool",
        list_url=_p("node-pools/"),
        detail_url=_p("node-pools/shared/"),
        read=Role.VIEWER,
        write=Role.OPERATOR,
        tenant_scoped=False,
        create=lambda w, x: {"name": "fresh-pool"},
        update=lambda w, x: {"description": "Changed"},
        delete=True,
        authorized_status={"delete": 409},  # tenant A holds quota in it
    ),
    Contract(
        basename="platform-audit-event",
        list_url=_p("audit-events/"),
        detail_url=_p("audit-events/{pk}/"),
        read=Role.OPERATOR,
        tenant_scoped=False,
        setup=_audit_event,
    ),
    Contract(
        basename="node",
        list_url=_p("nodes/"),
        detail_url=_p("nodes/n1/"),
        read=Role.OPERATOR,
        write=Role.OPERATOR,
        tenant_scoped=False,
        setup=_ready_node,
        create=lambda w, x: {"name": "fresh-node", "pool": "shared", "runtime": "simulated", "simulated_gpu_count": 4},
        update=lambda w, x: {"labels": {"rack": "r1"}},
        actions={name: _reason for name in ("provision", "cordon", "uncordon", "drain", "maintenance", "retire")},
        # From ready: provisioning, uncordoning and retiring are illegal transitions.
        authorized_status={"action:provision": 409, "action:uncordon": 409, "action:retire": 409},
    ),
    Contract(
        basename="node-gpu",
        list_url=_p("nodes/n1/gpus/"),
        detail_url=None,
        read=Role.OPERATOR,
        tenant_scoped=False,
        setup=_ready_node,
    ),
    Contract(
        basename="node-event",
        list_url=_p("nodes/n1/events/"),
        detail_url=None,
        read=Role.OPERATOR,
        tenant_scoped=False,
        setup=_ready_node,
    ),
    Contract(
        basename="gpu",
        list_url=_p("gpus/"),
        detail_url=_p("gpus/GPU-contract-0/"),
        read=Role.OPERATOR,
        tenant_scoped=False,
        setup=_ready_node,
    ),
    Contract(basename="me", list_url=_p("me/"), detail_url=None, read=Role.VIEWER, tenant_scoped=False),
    Contract(
        basename="token",
        list_url=_p("tokens/"),
        detail_url=None,  # personal: each persona reaches only its own; see test_tokens_are_personal
        read=Role.VIEWER,
        write=Role.VIEWER,
        tenant_scoped=False,
        create=lambda w, x: {"name": "mine", "tenant": "tenant-a", "role": "viewer"},
    ),
    Contract(
        basename="workload",
        list_url=_t("workloads/"),
        detail_url=_t("workloads/{pk}/"),
        read=Role.VIEWER,
        write=Role.MEMBER,
        setup=_workload_world,
        create=_workload_body,
        actions={"cancel": lambda w, x: {}, "extend": lambda w, x: {}, "restart": lambda w, x: {}},
        reads={"logs": "logs/", "logs-download": "logs/download/"},
        # Only an idle-warned running notebook can be extended, and only an ended workload restarted;
        # the contract's workload is a pending job.
        authorized_status={"action:extend": 409, "action:restart": 409},
    ),
    Contract(
        basename="workload-bulk",
        list_url=_t("workloads/bulk/"),
        detail_url=None,
        read=Role.VIEWER,
        write=Role.MEMBER,
        setup=_workload_world,
        create=lambda w, x: {"project": "alpha", "items": [_workload_body(w, x)]},
        authorized_status={"get": 405},  # POST only
    ),
    Contract(
        basename="allowed-image",
        list_url=_p("images/"),
        detail_url=_p("images/{pk}/"),
        read=Role.OPERATOR,
        write=Role.OPERATOR,
        tenant_scoped=False,
        setup=_allowed_image,
        create=lambda w, x: {"pattern": "registry.local/*", "tenant": "tenant-a", "notebook": True},
        delete=True,
    ),
    Contract(
        basename="tenant-image",
        list_url=_t("images/"),
        detail_url=None,  # read-only list
        read=Role.VIEWER,
        setup=_allowed_image,
    ),
    Contract(
        basename="preset",
        list_url=_t("presets/"),
        detail_url=_t("presets/{pk}/"),
        read=Role.VIEWER,
        write=Role.ADMIN,
        setup=_preset,
        create=_preset_body,
        update=lambda w, x: {"cpu_milli": 2000},
        delete=True,
    ),
]
BY_NAME = {c.basename: c for c in CONTRACTS}
OPERATIONS = ["get", "get-detail", "post", "patch", "delete"]


def _call(user: Any, method: str, url: str, body: dict[str, Any] | None) -> Any:
    client = client_for(user)
    verb = (
        "get"
        if method == "get-detail" or method.startswith("read:")
        else "post"
        if method.startswith("action:")
        else method
    )
    return getattr(client, verb)(url, body, format="json") if body is not None else getattr(client, verb)(url)


def _state() -> dict[str, int]:
    """Row counts of every model: a request with no side effect leaves them all unchanged."""
    return {model._meta.label: model._base_manager.count() for model in apps.get_models()}


def _cases(predicate: Callable[[Contract], bool] = lambda c: True) -> list[Any]:
    return [
        pytest.param(c.basename, op, id=f"{c.basename}-{op}")
        for c in CONTRACTS
        if predicate(c)
        for op in c.operations()
    ]


def _request(world: World, basename: str, operation: str) -> tuple[str, str, dict[str, Any] | None] | None:
    contract = BY_NAME[basename]
    extra = contract.setup(world)
    return next((r for r in contract.requests(world, extra) if r[0] == operation), None)


@pytest.mark.parametrize(("basename", "operation"), _cases())
def test_anonymous_callers_get_401(world: World, basename: str, operation: str) -> None:
    request = _request(world, basename, operation)
    if request is None:
        return
    before = _state()
    response = _call(None, *request)
    assert response.status_code == 401, response.content
    assert response.json()["error"]["code"] == "not_authenticated"
    assert _state() == before


@pytest.mark.parametrize(("basename", "operation"), _cases(lambda c: c.tenant_scoped))
def test_outsiders_get_404_and_change_nothing(world: World, basename: str, operation: str) -> None:
    request = _request(world, basename, operation)
    if request is None:
        return
    before = _state()
    response = _call(world.admin_b, *request)
    assert response.status_code == 404, response.content
    assert response.json()["error"]["code"] == "not_found"
    assert _state() == before, "a refused request must not change anything"


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize(("basename", "operation"), _cases())
def test_each_role_gets_exactly_its_rights(world: World, basename: str, operation: str, persona: str) -> None:
    contract = BY_NAME[basename]
    request = _request(world, basename, operation)
    if request is None:
        return
    needed = contract.read if operation.startswith(("get", "read:")) else contract.write
    before = _state()
    response = _call(getattr(world, persona), *request)
    if not RANK[persona].at_least(needed):
        assert response.status_code == 403, (persona, response.content)
        assert response.json()["error"]["code"] == "permission_denied"
        assert _state() == before
    else:
        expected = contract.authorized_status.get(operation)
        if expected is not None:
            assert response.status_code == expected, (persona, response.content)
        else:
            assert 200 <= response.status_code < 300, (persona, response.status_code, response.content)


def test_tokens_are_personal(world: World) -> None:
    mine = services.create_token(
        actor=Actor(user=world.member_a), tenant=world.tenant_a, name="m", role="member", expires_in_days=1
    )
    url = f"/api/v1/tokens/{mine.token.pk}/"
    assert client_for(world.member_a).get(url).status_code == 200
    for intruder in (world.admin_a, world.viewer_a, world.admin_b, world.operator):
        assert client_for(intruder).get(url).status_code == 404
        assert client_for(intruder).delete(url).status_code == 404
    assert ApiToken.all_tenants.get(pk=mine.token.pk).revoked_at is None
    assert client_for(world.member_a).delete(url).status_code == 200


def test_audit_events_cannot_be_written_through_the_api(world: World) -> None:
    event = _audit_event(world)["pk"]
    operator = client_for(world.operator)
    for url in ("/api/v1/audit-events/", "/api/v1/tenants/tenant-a/audit-events/"):
        assert operator.post(url, {"action": "forged"}, format="json").status_code == 405
        assert operator.patch(f"{url}{event}/", {"action": "forged"}, format="json").status_code == 405
        assert operator.delete(f"{url}{event}/").status_code == 405
    assert AuditEvent.all_tenants.get(pk=event).action == "project.update"


def _api_route_names(patterns: list[Any], prefix: str = "", namespace: str = "") -> set[str]:
    names: set[str] = set()
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            names |= _api_route_names(pattern.url_patterns, route, inner)
        elif isinstance(pattern, URLPattern) and route.startswith("api/v1/") and pattern.name:
            names.add(f"{namespace}{pattern.name}")
    return names


def test_every_api_route_has_a_contract() -> None:
    """Fails naming each API route without a row in CONTRACTS."""
    covered = {"api:schema", "api:docs"}
    for contract in CONTRACTS:
        covered.add(f"api:{contract.basename}-list")
        covered.add(f"api:{contract.basename}-detail")
        covered |= {f"api:{contract.basename}-{name}" for name in contract.actions}
        covered |= {f"api:{contract.basename}-{name}" for name in contract.reads}
    missing = sorted(_api_route_names(get_resolver().url_patterns) - covered)
    assert not missing, f"API routes without a permission contract: {missing}"


def test_meta_test_sees_the_routes() -> None:
    names = _api_route_names(get_resolver().url_patterns)
    assert {"api:project-list", "api:project-detail", "api:tenant-quota-list", "api:me-list"} <= names


@pytest.mark.parametrize("sealed", ["get_queryset", "initial", "dispatch", "check_permissions", "permission_classes"])
def test_subclasses_cannot_take_over_access_decisions(sealed: str) -> None:
    from tenants.api.base import PlatformViewSet, TenantViewSet

    for base in (TenantViewSet, PlatformViewSet):
        with pytest.raises(TypeError, match=sealed):
            type("Sneaky", (base,), {sealed: lambda self: None, "__module__": "tests.sneaky"})


def test_detail_routes_exist_for_contracts_that_claim_them(world: World) -> None:
    for contract in CONTRACTS:
        if contract.detail_url is None:
            continue
        url = contract.detail_url(world, contract.setup(world))
        assert client_for(world.operator).get(url).status_code in (200, 404), url
    assert TenantQuota.all_tenants.exists()
