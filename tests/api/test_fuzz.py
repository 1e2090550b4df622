"""The API keeps its contract under fuzzing (schemathesis over the published OpenAPI schema).

Every operation of the schema is called with generated query strings and
bodies, valid and invalid, as each role (operator, tenant admin, member,
viewer, anonymous), with real objects of tenant A in the path. The checks:
no 5xx, every response (status, headers, body) conforms to the schema, and
errors wear the API's JSON envelope. `FUZZ_EXAMPLES` sets the examples per
operation and role (the test command's default keeps CI short;
`bench/api_fuzz.py` runs the long form and reports the figures).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import positive_data_acceptance
from schemathesis.core.parameters import ParameterLocation

from accounting.models import Price
from tenants import services
from tenants.context import Actor
from tenants.models import ApiToken, AuditEvent
from tests.accounting import budget_factories
from tests.api.test_contract import (
    _allowed_image,
    _invitation,
    _member_token,
    _membership,
    _preset,
    _project_quota,
    _ready_node,
    _shared_volume_world,
    _storage_backend,
    _workload_world,
)
from tests.conftest import World
from tests.notifications import factories as notification_factories

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "6"))
ROLES = ["operator", "admin", "member", "viewer", "anonymous"]
# Every check schemathesis has (no 5xx, status codes, content types, headers and bodies as the schema
# says, schema-violating requests refused) except one: "a schema-valid request is accepted". A schema
# cannot say which project exists, which image a tenant allows or that a slug is taken; those are
# 400s naming the field, as they should be.
EXCLUDED_CHECKS = [positive_data_acceptance]
# Requests made per role (the benchmark reports them).
REQUESTS: Counter[str] = Counter()

SCHEMA = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))
SCHEMA.app = WSGIHandler()


@dataclass
class Objects:
    """Real objects of tenant A whose keys fill the path parameters, and a bearer token per role."""

    values: dict[str, str]
    tokens: dict[str, str | None]


def _token(world: World, role: str) -> str | None:
    if role == "anonymous":
        return None
    user = {"operator": world.operator, "admin": world.admin_a, "member": world.member_a, "viewer": world.viewer_a}
    tenant = None if role == "operator" else world.tenant_a
    issued = services.create_token(
        actor=Actor(user=user[role]), tenant=tenant, name=f"fuzz {role}", role=role, expires_in_days=1
    )
    return issued.secret


@pytest.fixture
def objects(world: World) -> Objects:
    node = _ready_node(world)
    from inventory.models import Gpu, Node

    gpu = Gpu.objects.filter(node_id=node["pk"]).first()
    project_quota = _project_quota(world)  # before the workload's world, which reuses it
    workload = _workload_world(world)
    asked = budget_factories.request_world(world)  # a project budget, the tenant's own, a pending request
    values = {
        "tenant": world.tenant_a.slug,
        "slug:tenants": world.tenant_a.slug,
        "slug:projects": world.project_a.slug,
        "name:nodes": Node.objects.get(pk=node["pk"]).name,
        "node": Node.objects.get(pk=node["pk"]).name,
        "name:node-pools": world.pool.name,
        "uuid": gpu.uuid if gpu else "GPU-none",
        "id:memberships": str(_membership(world)["pk"]),
        "id:invitations": str(_invitation(world)["pk"]),
        "id:presets": str(_preset(world)["pk"]),
        "id:images": str(_allowed_image(world)["pk"]),
        "id:project-quotas": str(project_quota["pk"]),
        "id:quotas": str(world.quota_a.pk),
        "id:workloads": str(workload["pk"]),
        "id:tokens": str(_member_token(world)["pk"]),
        "id:audit-events": str(AuditEvent.all_tenants.filter(tenant_id=world.tenant_a.pk).latest("id").pk),
        "id:volumes": str(_shared_volume_world(world)["pk"]),
        "volume": str(_shared_volume_world(world)["pk"]),
        "project:shares": "gamma",
        "name:storage-backends": "spare" if _storage_backend(world) else "",
        "id:webhooks": str(notification_factories.webhook_world(world)["pk"]),
        "id:webhook-deliveries": str(notification_factories.delivery_world(world)["pk"]),
        "kind:notification-preferences": "workload.failed",
        "id:budgets": str(asked["budget"]),
        "id:increase-requests": str(asked["pk"]),
        "id:prices": str(_future_price()),
    }
    tokens = {role: _token(world, role) for role in ROLES}
    assert ApiToken.all_tenants.count() >= 4
    return Objects(values=values, tokens=tokens)


def _future_price() -> int:
    """A GPU price from tomorrow on: one the API may still remove."""
    price = Price.objects.create(
        resource="gpu", amount_per_hour=Decimal("2.50"), effective_from=timezone.now() + timedelta(days=1)
    )
    return price.pk


def _path_value(objects: Objects, path: str, name: str) -> str | None:
    """Return the real object for path parameter `name` of `path` (keyed by name and the collection before it)."""
    segments = [part for part in path.split("/") if part]
    placeholder = "{" + name + "}"
    collection = segments[segments.index(placeholder) - 1] if placeholder in segments else ""
    return objects.values.get(f"{name}:{collection}", objects.values.get(name))


@pytest.fixture
def fill(objects: Objects) -> Callable[[Any], None]:
    def fill_case(case: Any) -> None:
        meta = case.meta
        if meta is not None and meta.is_negative_at(ParameterLocation.PATH):
            return  # a case about a malformed path keeps it
        for name in list(case.path_parameters or {}):
            value = _path_value(objects, case.path, name)
            if value is not None:
                case.path_parameters[name] = value

    return fill_case


@pytest.fixture(autouse=True)
def _connection_kept() -> Iterator[None]:
    """Keep the test's database connection across requests, as Django's test client does."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture(params=ROLES)
def role(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.django_db(transaction=False)
@SCHEMA.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
    derandomize=True,
)
def test_every_operation_keeps_its_contract_for_every_role(
    case: Any, role: str, objects: Objects, fill: Callable[[Any], None]
) -> None:
    fill(case)
    token = objects.tokens[role]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    REQUESTS[role] += 1
    case.call_and_validate(headers=headers, excluded_checks=EXCLUDED_CHECKS)


def test_every_path_parameter_of_the_schema_gets_a_real_object(objects: Objects) -> None:
    """A new endpoint is fuzzed with real objects in its path too: its parameters must be known here."""
    unknown = []
    for path in SCHEMA.raw_schema["paths"]:
        for name in re.findall(r"{(\w+)}", path):
            if _path_value(objects, path, name) is None:
                unknown.append(f"{path}: {name}")
    assert unknown == [], "add these to the `objects` fixture"
