"""The console under uvicorn (gpucloud/serving.py) records the socket's address unless a proxy is trusted.

uvicorn's default trusts X-Forwarded-For from loopback: a client there could
name any address in the audit log and the login lockout. These tests serve
the real ASGI application with the CLI's configuration and read the address
the audit log recorded for a real write.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gpucloud.asgi import application
from tenants.models import AuditEvent
from tenants.scoping import tenant_scope
from tests.conftest import World
from tests.frontend.live import token_for
from tests.workers import uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)

FORGED = "203.0.113.9"


def _recorded_address(world: World, slug: str) -> str | None:
    """Create project `slug` through the served console claiming to come from FORGED; return the audited address."""
    secret = token_for(world.admin_a, world.tenant_a, "admin")
    with uvicorn_server(application) as url:
        response = httpx.post(
            f"{url}/api/v1/tenants/tenant-a/projects/",
            json={"slug": slug, "name": slug},
            headers={"Authorization": f"Bearer {secret}", "X-Forwarded-For": FORGED},
            timeout=20,
        )
    assert response.status_code == 201, response.text
    with tenant_scope(world.tenant_a):
        event = AuditEvent.objects.get(action="project.create", after__slug=slug)
    return event.source_ip


def test_a_forwarded_for_header_is_ignored_without_a_trusted_proxy(world: World, settings: Any) -> None:
    settings.TRUST_X_FORWARDED_FOR = False
    assert _recorded_address(world, "gamma") == "127.0.0.1"


def test_behind_a_trusted_proxy_the_forwarded_address_is_recorded(world: World, settings: Any) -> None:
    settings.TRUST_X_FORWARDED_FOR = True
    assert _recorded_address(world, "delta") == FORGED
