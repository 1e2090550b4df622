"""A client generated from the published schema (openapi-python-client) works against the console.

That is what automation users do: generate a typed client from
`/api/v1/schema/` and call the API through it. The test generates one into
a temporary directory, imports it and drives a running console with it:
reads (a single object, pages, nullable fields), a write, and an error,
each parsed into the generated models.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.test import Client

from tenants import services
from tenants.context import Actor
from tests.conftest import World

VENV_BIN = Path(sys.executable).parent
GENERATED = "generated_gpucloud_api"


@pytest.fixture
def generated(tmp_path: Path, world: World) -> Iterator[ModuleType]:
    """Generate the client from the console's own schema and import it as `GENERATED`.

    Not as `gpucloud_client`, the generator's default: that is our own client package, which other tests
    in the same process import (the generated one would shadow it, or be shadowed by it).
    """
    schema = Client().get("/api/v1/schema/?format=json")
    assert schema.status_code == 200
    (tmp_path / "schema.json").write_text(json.dumps(json.loads(schema.content)))
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    run = subprocess.run(
        [
            str(VENV_BIN / "openapi-python-client"),
            "generate",
            "--path",
            str(tmp_path / "schema.json"),
            "--meta",
            "none",
            "--output-path",
            str(tmp_path / GENERATED),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Warning" not in run.stdout + run.stderr, "the schema generates without warnings: " + run.stdout
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(GENERATED)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name.split(".")[0] == GENERATED]:
            del sys.modules[name]


def _call(module: str, **kwargs: Any) -> Any:
    return importlib.import_module(f"{GENERATED}.api.{module}").sync_detailed(**kwargs)


@pytest.mark.django_db(transaction=True)
def test_a_client_generated_from_the_schema_drives_the_console(
    generated: ModuleType, world: World, live_server: Any
) -> None:
    admin = services.create_token(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, name="gen", role="admin", expires_in_days=1
    ).secret
    operator = services.create_token(
        actor=Actor(user=world.operator), tenant=None, name="gen-op", role="operator", expires_in_days=1
    ).secret
    client = generated.AuthenticatedClient(base_url=live_server.url, token=admin, raise_on_unexpected_status=True)
    models = importlib.import_module(f"{GENERATED}.models")

    me = _call("me.me_retrieve", client=client)
    assert me.status_code == 200 and isinstance(me.parsed, models.Me)
    assert me.parsed.username == "admin_a" and me.parsed.token.tenant == "tenant-a"

    created = _call(
        "tenants.tenants_projects_create",
        tenant="tenant-a",
        client=client,
        body=models.ProjectCreateRequest(slug="generated", name="Generated"),
    )
    assert created.status_code == 201 and created.parsed.slug == "generated"
    page = _call("tenants.tenants_projects_list", tenant="tenant-a", client=client)
    assert {project.slug for project in page.parsed.results} == {"alpha", "generated"}

    refused = _call(
        "tenants.tenants_projects_create",
        tenant="tenant-a",
        client=client,
        body=models.ProjectCreateRequest(slug="Not A Slug", name="x"),
    )
    assert refused.status_code == 400 and isinstance(refused.parsed, models.Error)
    assert "slug" in refused.parsed.error.fields.additional_properties
    missing = _call("tenants.tenants_projects_retrieve", tenant="tenant-a", slug="nowhere", client=client)
    assert missing.status_code == 404 and missing.parsed.error.code == "not_found"

    as_operator = generated.AuthenticatedClient(base_url=live_server.url, token=operator)
    tokens = _call("tokens.tokens_list", client=as_operator)
    assert tokens.status_code == 200
    assert [token.tenant for token in tokens.parsed.results] == [None], "an operator token's tenant is null"
    pools = _call("node_pools.node_pools_list", client=as_operator)
    assert pools.parsed.results[0].dedicated_tenant is None
