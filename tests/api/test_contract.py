"""The permission contract every API endpoint inherits.

Each row of CONTRACTS describes one endpoint: its URLs for a tenant-A
object, the payloads of its writes, and the least role each method needs.
The generic tests then hold every row to the same promises:

- anonymous callers get 401 on every method;
- a tenant admin of another tenant (the outsider) gets 404 on every method
  of a tenant-A URL, and nothing changes anywhere;
- below the required role the answer is 403, at or above it 2xx (viewers
  cannot write, members cannot administer, operators can do everything),
  through a browser session and through an API token alike;
- a user of two tenants (`dual`: admin in A and in B, with an admin token
  bound to each) acts in A with its session and its A token, and its B token
  gets 404 on every tenant-A operation and sees nothing of A anywhere else;
- once tenant A is deactivated, or a member removed from it, their sessions
  get 404 on every tenant-A operation and see nothing of A elsewhere, and
  their tokens get 401 on every operation;
- and meta-tests fail when an API route, or an operation of the published
  OpenAPI schema, has no row here.

Adding an endpoint means adding a row.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.db import transaction
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from inventory.choices import NodeState
from inventory.models import Gpu, Node, NodePool
from inventory.services import register_node, transition_node
from tenants import services
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import ApiToken, AuditEvent, Membership, Project, ProjectQuota, Tenant, TenantQuota
from tenants.scoping import tenant_scope
from tests.accounting import budget_factories
from tests.conftest import PASSWORD, World, client_for
from tests.notifications import factories as notification_factories

Urls = Callable[[World, dict[str, Any]], str]
Payload = Callable[[World, dict[str, Any]], dict[str, Any]]
PERSONAS = ["viewer_a", "member_a", "admin_a", "dual", "operator"]
RANK = {
    "viewer_a": Role.VIEWER,
    "member_a": Role.MEMBER,
    "admin_a": Role.ADMIN,
    "dual": Role.ADMIN,
    "operator": Role.OPERATOR,
}
CREDENTIALS = ["session", "token"]

# The agent gateway answers node credentials alone (jobs.api.agent); its contract is that no user opens it,
# held below for every persona and credential, and the node rules in tests/inventory/test_agent_gateway.py.
AGENT_GATEWAY: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "api:agent-reports": ("post", "/api/v1/agent/reports", {"messages": []}),
    "api:agent-commands": ("get", "/api/v1/agent/commands?wait=0", None),
}


@dataclass(frozen=True)
class Call:
    """One more operation of an endpoint: `verb` on `url`, needing `role`.

    For operations the generic ones cannot express: a PUT, a DELETE with a
    query, a POST that is not `<detail>/<name>/`, or one needing another
    role than the endpoint's `read`/`write`. `route` is the route name it
    exercises (`<basename>-<route>`), when that is not the list's or the
    detail's.
    """

    verb: str
    url: Urls
    role: Role
    body: Payload | None = None
    route: str | None = None


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
    # Any other operation, by a name of its own (see Call).
    calls: dict[str, Call] = field(default_factory=dict)

    def operations(self) -> list[str]:
        return (
            OPERATIONS
            + [f"action:{name}" for name in self.actions]
            + [f"read:{name}" for name in self.reads]
            + [f"call:{name}" for name in self.calls]
        )

    def needed(self, operation: str) -> Role:
        """Return the least role `operation` needs."""
        if operation.startswith("call:"):
            return self.calls[operation.removeprefix("call:")].role
        return self.read if _is_read(operation) else self.write

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
        for name, call in self.calls.items():
            items.append((f"call:{name}", call.url(world, extra), call.body(world, extra) if call.body else None))
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


def _invitation(world: World) -> dict[str, Any]:
    with tenant_scope(world.tenant_a):
        issued = services.invite_member(actor=Actor(user=world.admin_a), tenant=world.tenant_a, username="guest")
    return {"pk": issued.invitation.pk}


def _no_secret(world: World, extra: dict[str, Any]) -> dict[str, Any]:
    return {"secret": "made-up"}


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


def _bulk_item(world: World, extra: dict[str, Any]) -> dict[str, Any]:
    """A bulk item: a workload body without its project (the bulk's own; an item naming one is refused)."""
    return {k: v for k, v in _workload_body(world, extra).items() if k != "project"}


def _price(world: World) -> dict[str, Any]:
    """A GPU price that takes effect tomorrow: the one kind an operator may still remove."""
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from accounting.models import Price

    price = Price.objects.create(
        resource="gpu", amount_per_hour=Decimal("2.5"), effective_from=timezone.now() + timedelta(days=1)
    )
    return {"pk": price.pk}


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


def _volume_world(world: World) -> dict[str, Any]:
    """Alpha's project volume `alpha-files` holds hello.txt; member_a and viewer_a work in alpha; `gamma` exists."""
    from inventory.models import Volume
    from inventory.services import volume_files, volumes
    from tests.jobs.factories import assign

    for user in (world.member_a, world.viewer_a):
        assign(user, world.project_a)
    Project.all_tenants.get_or_create(tenant=world.tenant_a, slug="gamma", defaults={"name": "Gamma"})
    volume = Volume.all_tenants.filter(tenant=world.tenant_a, name="alpha-files").first()
    if volume is None:
        volume = volumes.create_volume(
            actor=Actor(user=world.admin_a), tenant=world.tenant_a, kind="project", name="alpha-files",
            project=world.project_a,
        )  # fmt: skip
    Path(volume_files.ensure_directory(volume), "hello.txt").write_bytes(b"hello")
    return {"pk": volume.pk}


def _shared_volume_world(world: World) -> dict[str, Any]:
    """`_volume_world`, with alpha-files shared read-only with gamma."""
    from inventory.models import Volume
    from inventory.services import volumes

    extra = _volume_world(world)
    gamma = Project.all_tenants.get(tenant=world.tenant_a, slug="gamma")
    volume = Volume.all_tenants.get(pk=extra["pk"])
    volumes.share_volume(actor=Actor(user=world.admin_a), volume=volume, project=gamma)
    return {**extra, "shared": "gamma"}


def _storage_backend(world: World) -> dict[str, Any]:
    """A spare shared backend beside the test's storage root; `root` is where a fresh one may go."""
    from django.conf import settings

    from inventory.models import StorageBackend
    from inventory.services.storage import create_storage_backend

    beside = Path(settings.STORAGE_ROOT).parent
    if not StorageBackend.objects.filter(name="spare").exists():
        operator = Actor(user=world.operator)
        create_storage_backend(actor=operator, name="spare", kind="shared", path=str(beside / "spare"))
    return {"root": str(beside / "fresh")}


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
        update=lambda w, x: {"role": "viewer"},
        delete=True,
    ),
    Contract(
        basename="invitation",
        list_url=_t("invitations/"),
        detail_url=_t("invitations/{pk}/"),
        read=Role.ADMIN,
        setup=_invitation,
        create=lambda w, x: {"username": "newcomer", "role": "viewer"},
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
        actions={
            name: _reason
            for name in (
                "provision",
                "cordon",
                "uncordon",
                "drain",
                "maintenance",
                "retire",
                "join-token",
                "revoke-agent",
            )
        },
        # From ready: provisioning, uncordoning and retiring are illegal transitions; a simulated node joins no host.
        authorized_status={
            "action:provision": 409,
            "action:uncordon": 409,
            "action:retire": 409,
            "action:join-token": 409,
        },
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
    # Answering (accept, decline) needs the link's secret and a password session: tests/tenants/test_invitations.py.
    Contract(
        basename="invitation-to-me",
        list_url=_p("invitations/"),
        detail_url=None,
        read=Role.VIEWER,
        tenant_scoped=False,
        calls={
            "invitation-accept": Call("post", _p("invitations/accept/"), Role.VIEWER, _no_secret, "accept"),
            "invitation-decline": Call("post", _p("invitations/decline/"), Role.VIEWER, _no_secret, "decline"),
        },
        # A made-up secret opens nothing, whoever sends it; the real answers are in test_invitations.py.
        authorized_status={"call:invitation-accept": 400, "call:invitation-decline": 400},
    ),
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
        actions={
            "cancel": lambda w, x: {},
            "extend": lambda w, x: {},
            "restart": lambda w, x: {},
            "hibernate": lambda w, x: {},
            "resume": lambda w, x: {},
        },
        reads={"logs": "logs/", "logs-download": "logs/download/"},
        calls={"workload-validate": Call("post", _t("workloads/validate/"), Role.MEMBER, _workload_body, "validate")},
        # Only an idle-warned running notebook can be extended, only an ended workload restarted, and only
        # notebooks hibernate and resume; the contract's workload is a pending job.
        authorized_status={
            "action:extend": 409,
            "action:restart": 409,
            "action:hibernate": 409,
            "action:resume": 409,
        },
    ),
    Contract(
        basename="workload-bulk",
        list_url=_t("workloads/bulk/"),
        detail_url=None,
        read=Role.VIEWER,
        write=Role.MEMBER,
        setup=_workload_world,
        create=lambda w, x: {"project": "alpha", "items": [_bulk_item(w, x)]},
        authorized_status={"get": 405},  # POST only
        calls={
            "bulk-validate": Call(
                "post",
                _t("workloads/bulk/validate/"),
                Role.MEMBER,
                lambda w, x: {"project": "alpha", "items": [_bulk_item(w, x)]},
                "validate",
            )
        },
    ),
    Contract(
        basename="usage",
        list_url=_t("usage/"),
        detail_url=None,  # one read: the tenant's quotas with what is held and waits
        read=Role.VIEWER,
        setup=_workload_world,
    ),
    Contract(
        basename="budget",
        list_url=_t("budgets/"),
        detail_url=_t("budgets/{pk}/"),
        read=Role.VIEWER,
        setup=budget_factories.budget_world,
        create=lambda w, x: {"project": "alpha", "unit": "money", "amount": "250"},
        update=lambda w, x: {"amount": "150", "hard_action": "refuse_new"},
        delete=True,
    ),
    Contract(
        basename="platform-budget",
        list_url=_p("budgets/"),
        detail_url=_p("budgets/{own}/"),
        read=Role.OPERATOR,
        write=Role.OPERATOR,
        tenant_scoped=False,
        setup=budget_factories.budget_world,
        create=lambda w, x: {"tenant": "tenant-a", "unit": "gpu_hours", "amount": "500"},
        update=lambda w, x: {"amount": "900"},
        delete=True,
    ),
    Contract(
        basename="increase-request",
        list_url=_t("increase-requests/"),
        detail_url=_t("increase-requests/{pk}/"),
        read=Role.VIEWER,
        write=Role.MEMBER,
        setup=budget_factories.request_world,
        create=budget_factories.ask_body,
        actions={"cancel": lambda w, x: {}},  # member_a asked it; a decider may withdraw it too
        calls={
            "increase-approve": Call(
                "post", _t("increase-requests/{pk}/approve/"), Role.ADMIN, lambda w, x: {"note": "ok"}, "approve"
            ),
            "increase-refuse": Call(
                "post", _t("increase-requests/{pk}/refuse/"), Role.ADMIN, lambda w, x: {"note": "no"}, "refuse"
            ),
        },
    ),
    Contract(
        basename="accounting",
        list_url=_t("accounting/?by=project,user"),
        detail_url=None,  # one read: the tenant's usage report, and the same as CSV
        read=Role.ADMIN,
        setup=_workload_world,
        calls={"accounting-csv": Call("get", _t("accounting/csv/?period=last-month"), Role.ADMIN, route="csv")},
    ),
    Contract(
        basename="platform-accounting",
        list_url=_p("accounting/?by=tenant,pool"),
        detail_url=None,
        read=Role.OPERATOR,
        tenant_scoped=False,
        setup=_workload_world,
        calls={"platform-accounting-csv": Call("get", _p("accounting/csv/"), Role.OPERATOR, route="csv")},
    ),
    Contract(
        basename="price",
        list_url=_p("prices/"),
        detail_url=_p("prices/{pk}/"),
        read=Role.VIEWER,
        write=Role.OPERATOR,
        tenant_scoped=False,
        setup=_price,
        create=lambda w, x: {"resource": "gpu", "gpu_model": "NVIDIA H100 80GB HBM3", "amount_per_hour": "3.1"},
        delete=True,
    ),
    Contract(
        basename="webhook",
        list_url=_t("webhooks/"),
        detail_url=_t("webhooks/{pk}/"),
        read=Role.ADMIN,
        setup=notification_factories.webhook_world,
        create=lambda w, x: {"url": "https://hooks.example.com/new", "kinds": ["workload.failed"]},
        update=lambda w, x: {"description": "Changed"},
        delete=True,
        actions={"rotate-secret": lambda w, x: {}},
    ),
    Contract(
        basename="webhook-delivery",
        list_url=_t("webhook-deliveries/"),
        detail_url=_t("webhook-deliveries/{pk}/"),
        read=Role.ADMIN,
        setup=notification_factories.delivery_world,
    ),
    Contract(
        basename="notification-email",
        list_url=_t("notification-emails/"),
        detail_url=None,  # read-only list of the caller's own e-mails
        read=Role.VIEWER,
    ),
    Contract(
        basename="notification-preference",
        list_url=_t("notification-preferences/"),
        detail_url=_t("notification-preferences/workload.failed/"),
        read=Role.VIEWER,
        write=Role.VIEWER,  # everyone chooses their own
        update=lambda w, x: {"email": True},
    ),
    Contract(
        basename="platform-webhook",
        list_url=_p("webhooks/"),
        detail_url=_p("webhooks/{pk}/"),
        read=Role.OPERATOR,
        write=Role.OPERATOR,
        tenant_scoped=False,
        setup=notification_factories.platform_webhook_world,
        create=lambda w, x: {"url": "https://ops.example.com/new", "kinds": ["node.health"]},
        update=lambda w, x: {"description": "Changed"},
        delete=True,
        actions={"rotate-secret": lambda w, x: {}},
    ),
    Contract(
        basename="platform-webhook-delivery",
        list_url=_p("webhook-deliveries/"),
        detail_url=_p("webhook-deliveries/{pk}/"),
        read=Role.OPERATOR,
        tenant_scoped=False,
        setup=notification_factories.platform_delivery_world,
    ),
    Contract(
        basename="platform-notification-email",
        list_url=_p("notification-emails/"),
        detail_url=None,
        read=Role.OPERATOR,
        tenant_scoped=False,
    ),
    Contract(
        basename="platform-notification-preference",
        list_url=_p("notification-preferences/"),
        detail_url=_p("notification-preferences/node.health/"),
        read=Role.OPERATOR,
        write=Role.OPERATOR,
        tenant_scoped=False,
        update=lambda w, x: {"email": False},
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
CONTRACTS += [
    Contract(
        basename="volume",
        list_url=_t("volumes/"),
        detail_url=_t("volumes/{pk}/"),
        read=Role.VIEWER,
        write=Role.ADMIN,
        setup=_volume_world,
        create=lambda w, x: {"kind": "dataset", "name": "fresh-data", "project": "alpha"},
        update=lambda w, x: {"description": "Changed", "size_limit_bytes": 10**9},
        delete=True,
        authorized_status={"delete": 409},  # it still holds hello.txt
        calls={"volume-home": Call("post", _t("volumes/home/"), Role.MEMBER, route="home")},
    ),
    Contract(
        basename="volume-share",
        list_url=_t("volumes/{pk}/shares/"),
        detail_url=_t("volumes/{pk}/shares/{shared}/"),
        read=Role.VIEWER,
        write=Role.ADMIN,
        setup=_shared_volume_world,
        create=lambda w, x: {"project": "gamma", "read_only": False},
        delete=True,
    ),
    Contract(
        basename="volume-file",
        list_url=_t("volumes/{pk}/files/?path="),
        detail_url=None,  # files are named by ?path=: the calls below
        read=Role.VIEWER,
        write=Role.MEMBER,
        setup=_volume_world,
        calls={
            "file-download": Call(
                "get", _t("volumes/{pk}/files/content/?path=hello.txt"), Role.VIEWER, None, "content"
            ),
            "file-upload": Call(
                "put", _t("volumes/{pk}/files/content/?path=up.txt"), Role.MEMBER, lambda w, x: {"a": 1}, "content"
            ),
            "file-folder": Call(
                "post", _t("volumes/{pk}/files/folders/"), Role.MEMBER, lambda w, x: {"path": "made"}, "folders"
            ),
            "file-delete": Call("delete", _t("volumes/{pk}/files/?path=hello.txt"), Role.MEMBER),
        },
    ),
    Contract(
        basename="storage-backend",
        list_url=_p("storage-backends/"),
        detail_url=_p("storage-backends/spare/"),
        read=Role.OPERATOR,
        write=Role.OPERATOR,
        tenant_scoped=False,
        setup=_storage_backend,
        create=lambda w, x: {"name": "fresh-store", "path": x["root"]},
        delete=True,
    ),
]
BY_NAME = {c.basename: c for c in CONTRACTS}
# Every Call by its operation name ("call:<name>"; names are unique across contracts).
CALLS = {f"call:{name}": call for c in CONTRACTS for name, call in c.calls.items()}
OPERATIONS = ["get", "get-detail", "post", "patch", "delete"]


def _call(principal: Any, method: str, url: str, body: dict[str, Any] | None) -> Any:
    """Send one contract request as `principal`: a user (a browser session), None (anonymous) or a client."""
    client = principal if isinstance(principal, APIClient) else client_for(principal)
    verb = (
        "get"
        if method == "get-detail" or method.startswith("read:")
        else "post"
        if method.startswith("action:")
        else CALLS[method].verb
        if method.startswith("call:")
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


def _dual(world: World) -> User:
    """The user of two tenants: admin in tenant A and in tenant B."""
    user = User.objects.filter(username="dual").first()
    if user is None:
        user = User.objects.create_user("dual", "dual@example.com", PASSWORD)
        for tenant in (world.tenant_a, world.tenant_b):
            Membership.all_tenants.create(tenant=tenant, user=user, role="admin")
    return user


def _user(world: World, persona: str) -> User:
    return _dual(world) if persona == "dual" else getattr(world, persona)


def _bearer(user: User, tenant: Tenant | None, role: Role) -> APIClient:
    """Return a client presenting a new API token of `user` bound to `tenant` with `role`."""
    issued = services.create_token(actor=Actor(user=user), tenant=tenant, name="contract", role=role, expires_in_days=1)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    return client


def _principal(world: World, persona: str, credential: str) -> Any:
    """Return `persona` as a browser session (the user) or as its token: bound to tenant A with its role
    there, or for the operator a platform-wide operator token."""
    user = _user(world, persona)
    if credential == "session":
        return user
    return _bearer(user, None if persona == "operator" else world.tenant_a, RANK[persona])


def _is_read(operation: str) -> bool:
    if operation.startswith("call:"):
        return CALLS[operation].verb == "get"
    return operation.startswith(("get", "read:"))


@pytest.mark.parametrize("credential", CREDENTIALS)
@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize(("basename", "operation"), _cases())
def test_each_role_gets_exactly_its_rights(
    world: World, basename: str, operation: str, persona: str, credential: str
) -> None:
    contract = BY_NAME[basename]
    request = _request(world, basename, operation)
    if request is None:
        return
    needed = contract.needed(operation)
    principal = _principal(world, persona, credential)
    before = _state()
    response = _call(principal, *request)
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


@pytest.mark.parametrize("credential", CREDENTIALS)
@pytest.mark.parametrize("persona", [*PERSONAS, "anonymous"])
@pytest.mark.parametrize("route", sorted(AGENT_GATEWAY))
def test_no_user_opens_the_agent_gateway(world: World, route: str, persona: str, credential: str) -> None:
    method, url, body = AGENT_GATEWAY[route]
    principal = None if persona == "anonymous" else _principal(world, persona, credential)
    client = principal if isinstance(principal, APIClient) else client_for(principal)
    response = getattr(client, method)(url, body, format="json") if body is not None else getattr(client, method)(url)
    assert response.status_code in (401, 403), (persona, response.content)
    # A join token is the only way in without a node credential, and a made-up one opens nothing.
    joined = client.post("/api/v1/agent/join", {"token": "gpcj_0000_forged"}, format="json")
    assert joined.status_code == 403 and "credential" not in joined.json()


# --- one user, two tenants; a deactivated tenant; a removed member ---------------------------------------


def _a_only_pool(world: World) -> None:
    """A pool dedicated to tenant A: what A's people see among the pools, and nobody else."""
    NodePool.objects.get_or_create(
        name="a-only", defaults={"description": "Reserved for Tenant A", "dedicated_tenant": world.tenant_a}
    )


def _sees_nothing_of_tenant_a(response: Any, operation: str, *, slug_too: bool) -> None:
    """Hold a platform operation's answer to showing nothing of tenant A: a read may succeed without naming
    A (its name, or with `slug_too` its slug), anything else is refused."""
    body = response.content.decode()
    if 200 <= response.status_code < 300:
        assert _is_read(operation), (response.status_code, body)
        assert "Tenant A" not in body, body
        assert not slug_too or "tenant-a" not in body, body
    else:
        assert response.status_code in (400, 403, 404, 405), (response.status_code, body)


@pytest.mark.parametrize(("basename", "operation"), _cases(lambda c: c.tenant_scoped))
def test_a_token_bound_to_another_tenant_gets_404_where_its_owner_is_admin(
    world: World, basename: str, operation: str
) -> None:
    """dual is an admin of tenant A: its session and its A token act there (test_each_role_gets_exactly_its_rights),
    its B token gets what an outsider gets."""
    request = _request(world, basename, operation)
    if request is None:
        return
    token_b = _bearer(_dual(world), world.tenant_b, Role.ADMIN)
    before = _state()
    response = _call(token_b, *request)
    assert response.status_code == 404, response.content
    assert response.json()["error"]["code"] == "not_found"
    assert _state() == before, "a refused request must not change anything"


@pytest.mark.parametrize(("basename", "operation"), _cases(lambda c: not c.tenant_scoped))
def test_a_token_bound_to_another_tenant_sees_nothing_of_it_on_platform_routes(
    world: World, basename: str, operation: str
) -> None:
    request = _request(world, basename, operation)
    if request is None:
        return
    dual = _dual(world)
    _bearer(dual, world.tenant_a, Role.ADMIN)  # a token of A it must not even list
    token_b = _bearer(dual, world.tenant_b, Role.ADMIN)
    _a_only_pool(world)
    before = _state()
    _sees_nothing_of_tenant_a(_call(token_b, *request), operation, slug_too=True)
    assert _state() == before


def _deactivate_tenant_a(world: World) -> None:
    services.update_tenant(actor=Actor(user=world.operator), tenant=world.tenant_a, is_active=False)


def _remove_from_tenant_a(world: World) -> None:
    for user in (world.member_a, _dual(world)):
        membership = Membership.all_tenants.get(tenant=world.tenant_a, user=user)
        with tenant_scope(world.tenant_a):
            services.remove_member(actor=Actor(user=world.operator), membership=membership)


# Who loses tenant A in each scenario, and how.
LOSS = {
    "deactivated": (_deactivate_tenant_a, ["viewer_a", "member_a", "admin_a", "dual"]),
    "removed": (_remove_from_tenant_a, ["member_a", "dual"]),
}


@pytest.mark.parametrize("scenario", sorted(LOSS))
@pytest.mark.parametrize(("basename", "operation"), _cases())
def test_a_deactivated_tenant_or_a_removed_member_is_refused_at_once_everywhere(
    world: World, basename: str, operation: str, scenario: str
) -> None:
    """Sessions: 404 on every tenant-A operation, nothing of A on the others. Tokens: 401 on every operation."""
    request = _request(world, basename, operation)
    if request is None:
        return
    lose, personas = LOSS[scenario]
    tokens = {persona: _principal(world, persona, "token") for persona in personas}
    _a_only_pool(world)
    lose(world)
    before = _state()
    for persona in personas:
        refused = _call(tokens[persona], *request)
        assert refused.status_code == 401, (persona, refused.content)
        answer = _call(_user(world, persona), *request)
        if BY_NAME[basename].tenant_scoped:
            assert answer.status_code == 404, (persona, answer.content)
        else:
            _sees_nothing_of_tenant_a(answer, operation, slug_too=False)
    assert _state() == before, "a refused request must not change anything"
    if scenario == "deactivated" and _is_read(operation):
        # Operators still see a deactivated tenant: they are the ones who may turn it on again.
        assert _call(world.operator, *request).status_code in (200, BY_NAME[basename].authorized_status.get(operation))


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
    covered = {"api:schema", "api:docs", "api:agent-join", *AGENT_GATEWAY}
    for contract in CONTRACTS:
        covered.add(f"api:{contract.basename}-list")
        covered.add(f"api:{contract.basename}-detail")
        covered |= {f"api:{contract.basename}-{name}" for name in contract.actions}
        covered |= {f"api:{contract.basename}-{name}" for name in contract.reads}
        covered |= {f"api:{contract.basename}-{call.route}" for call in contract.calls.values() if call.route}
    missing = sorted(_api_route_names(get_resolver().url_patterns) - covered)
    assert not missing, f"API routes without a permission contract: {missing}"


# Schema operations that the generic tests above cannot reach (each persona sees a different object there),
# and the tests that hold them to the contract instead.
COVERED_ELSEWHERE = {
    ("GET", "/api/v1/tokens/{id}/"): "test_tokens_are_personal; tests/tenants/test_tokens.py (the token rule)",
    ("DELETE", "/api/v1/tokens/{id}/"): "test_tokens_are_personal; tests/tenants/test_tokens.py (the token rule)",
}
_VERBS = {"get": "GET", "get-detail": "GET", "post": "POST", "patch": "PATCH", "delete": "DELETE"}


def _schema_operations() -> set[tuple[str, str]]:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    methods = {"get", "post", "put", "patch", "delete"}
    return {(method.upper(), path) for path, item in schema["paths"].items() for method in item if method in methods}


def _template_of(url: str, templates: list[str]) -> str | None:
    """Return the schema path `url` is an instance of, preferring literal segments (`bulk/` over `{id}/`)."""
    for template in sorted(templates, key=lambda t: t.count("{")):
        pattern = "[^/]+".join(re.escape(part) for part in re.split(r"\{[^}]+\}", template))
        if re.fullmatch(pattern, url.split("?")[0]):
            return template
    return None


def test_every_schema_operation_has_a_contract(world: World) -> None:
    """Fails naming each operation of the published OpenAPI schema that no contract request exercises."""
    operations = _schema_operations()
    templates = sorted({path for _, path in operations})
    covered = set(COVERED_ELSEWHERE)
    for contract in CONTRACTS:
        for method, url, _ in contract.requests(world, contract.setup(world)):
            verb = _VERBS.get(method) or (
                "POST" if method.startswith("action:") else CALLS[method].verb.upper() if method in CALLS else "GET"
            )
            template = _template_of(url, templates)
            assert template is not None, f"{contract.basename} {method} {url} is not in the schema"
            covered.add((verb, template))
    missing = sorted(operations - covered)
    assert not missing, f"schema operations without a permission contract: {missing}"
    assert len(operations) > 60, "the schema generator found the API"


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
