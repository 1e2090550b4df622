"""One error format across the API, and the API's own documentation served locally."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from tests.conftest import World, client_for


def _envelope(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["request_id"] == response["X-Request-ID"]
    return error


def test_each_error_status_uses_the_envelope(world: World) -> None:
    admin = client_for(world.admin_a)
    cases = [
        (
            admin.post("/api/v1/tenants/tenant-a/projects/", {"slug": "Bad Slug!", "name": "x"}, format="json"),
            400,
            "validation_error",
        ),
        (APIClient().get("/api/v1/me/"), 401, "not_authenticated"),
        (
            client_for(world.viewer_a).post("/api/v1/tenants/tenant-a/projects/", {}, format="json"),
            403,
            "permission_denied",
        ),
        (admin.get("/api/v1/tenants/tenant-b/projects/"), 404, "not_found"),
        (admin.put("/api/v1/tenants/tenant-a/projects/alpha/", {}, format="json"), 405, "method_not_allowed"),
        (client_for(world.operator).delete("/api/v1/node-pools/shared/"), 409, "pool_in_use"),
    ]
    for response, status, code in cases:
        assert response.status_code == status, response.content
        assert _envelope(response)["code"] == code


def test_validation_errors_list_every_field_with_its_rule(world: World) -> None:
    response = client_for(world.admin_a).post(
        "/api/v1/tenants/tenant-a/projects/", {"slug": "Bad Slug!"}, format="json"
    )
    error = _envelope(response)
    assert error["fields"]["name"][0]["code"] == "required"
    response = client_for(world.admin_a).post(
        "/api/v1/tenants/tenant-a/projects/", {"slug": "Bad Slug!", "name": "x"}, format="json"
    )
    assert _envelope(response)["fields"]["slug"][0]["code"] == "invalid_slug"


def test_malformed_json_is_a_validation_error(world: World) -> None:
    response = client_for(world.admin_a).generic(
        "POST", "/api/v1/tenants/tenant-a/projects/", "{not json", content_type="application/json"
    )
    assert response.status_code == 400
    assert _envelope(response)["code"] == "parse_error"


def test_unknown_api_paths_answer_json_404(world: World) -> None:
    response = client_for(world.admin_a).get("/api/v1/nope/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_caller_request_id_is_echoed_when_well_formed(world: World) -> None:
    client = client_for(world.admin_a)
    assert client.get("/api/v1/me/", HTTP_X_REQUEST_ID="trace-abcdef12")["X-Request-ID"] == "trace-abcdef12"
    assert client.get("/api/v1/me/", HTTP_X_REQUEST_ID="bad id; drop table")["X-Request-ID"] != "bad id; drop table"


def test_openapi_schema_is_valid(world: World) -> None:
    from openapi_spec_validator import validate

    response = client_for(world.admin_a).get("/api/v1/schema/?format=json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    assert schema["openapi"].startswith("3.")
    assert "/api/v1/tenants/{tenant}/projects/" in schema["paths"]
    assert schema["components"]["securitySchemes"]["apiToken"]["scheme"] == "bearer"
    validate(schema)


def test_swagger_ui_is_served_from_local_static_files(world: World) -> None:
    response = client_for(world.admin_a).get("/api/v1/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "/static/vendor/swagger-ui/swagger-ui-bundle.js" in html
    assert "cdn." not in html and "unpkg" not in html and "jsdelivr" not in html


@pytest.mark.parametrize("debug", [False, True])
def test_an_unhandled_error_under_the_api_answers_the_json_500_envelope(
    world: World, monkeypatch, settings, debug: bool
) -> None:
    settings.DEBUG = debug  # the debug page is for the console's pages, never the API
    from tenants import selectors

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(selectors, "memberships_of_user", broken)
    client = client_for(world.admin_a)
    client.raise_request_exception = False  # as a real server: the handler answers, the test client would raise
    response = client.get("/api/v1/me/")
    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    error = _envelope(response)
    assert error["code"] == "server_error"
    assert "a bug" not in response.content.decode(), "nothing of the error itself reaches the client"


def test_numbers_past_the_databases_range_are_400s_naming_the_field(world: World) -> None:
    from tests.jobs.factories import add_node, assign

    add_node(world, "n-range", gpus=1)
    assign(world.member_a, world.project_a)
    member = client_for(world.member_a)
    body = {"project": "alpha", "pool": "shared", "name": "x", "image": "busybox:1", "preset": 2**70}
    single = member.post("/api/v1/tenants/tenant-a/workloads/", body, format="json")
    assert single.status_code == 400, single.content
    assert "preset" in _envelope(single)["fields"]
    items = [{"name": "x", "image": "busybox:1", "gpus_per_replica": 2**40}]
    bulk = member.post(
        "/api/v1/tenants/tenant-a/workloads/bulk/",
        {"project": "alpha", "pool": "shared", "items": items},
        format="json",
    )
    assert bulk.status_code == 400, bulk.content
    assert any("gpus_per_replica" in name for name in _envelope(bulk)["fields"])
    quota = client_for(world.operator).patch(
        f"/api/v1/tenants/tenant-a/quotas/{world.quota_a.pk}/", {"limit": 2**63, "weight": -(2**63)}, format="json"
    )
    assert quota.status_code == 400, quota.content
    assert {"limit", "weight"} <= set(_envelope(quota)["fields"]), "every failing field at once"


def test_ids_and_filters_past_the_databases_range_are_refused_cleanly(world: World) -> None:
    operator = client_for(world.operator)
    long_id = operator.get(f"/api/v1/tenants/tenant-a/workloads/{2**70}/")
    assert long_id.status_code == 404 and _envelope(long_id)["code"] == "not_found"
    huge_filter = operator.get(f"/api/v1/audit-events/?tenant={2**70}")
    assert huge_filter.status_code == 400, huge_filter.content
    _envelope(huge_filter)
    page = operator.get("/api/v1/tenants/?page=0&page_size=501")
    assert page.status_code == 400
    assert {"page", "page_size"} & set(_envelope(page)["fields"])


def test_values_of_the_wrong_json_type_are_refused_not_coerced(world: World) -> None:
    admin = client_for(world.admin_a)
    response = admin.post(
        "/api/v1/tenants/tenant-a/projects/", {"slug": "fresh", "name": 12, "description": ["x"]}, format="json"
    )
    assert response.status_code == 400
    assert set(_envelope(response)["fields"]) == {"name", "description"}
    listed = admin.get("/api/v1/tenants/?is_active=maybe")
    assert listed.status_code in (400, 403)  # tenant admins may not list tenants; operators get the 400
    assert client_for(world.operator).get("/api/v1/tenants/?is_active=maybe").status_code == 400


def test_a_form_body_is_refused_the_api_reads_json(world: World) -> None:
    response = client_for(world.admin_a).post("/api/v1/tenants/tenant-a/projects/", {"slug": "f", "name": "F"})
    assert response.status_code == 415
    assert _envelope(response)["code"] == "unsupported_media_type"


def test_the_schema_tells_nullable_fields_and_single_objects_as_they_are(world: World) -> None:
    schema = json.loads(client_for(world.admin_a).get("/api/v1/schema/?format=json").content)
    components = schema["components"]["schemas"]
    for component, field in [
        ("NodePool", "dedicated_tenant"),
        ("ApiToken", "tenant"),
        ("IssuedToken", "tenant"),
        ("AuditEvent", "tenant"),
        ("AllowedImage", "tenant"),
    ]:
        assert components[component]["properties"][field].get("nullable") is True, (component, field)
    me = schema["paths"]["/api/v1/me/"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert me == {"$ref": "#/components/schemas/Me"}
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            errors = {status for status in operation["responses"] if status.startswith(("4", "5"))}
            assert {"401", "403", "500"} <= errors, (method, path)
            for status in errors:
                content = operation["responses"][status]["content"]["application/json"]["schema"]
                assert content == {"$ref": "#/components/schemas/Error"}, (method, path, status)


def test_bodies_too_deep_or_too_large_are_refused_before_they_are_read(world: World, monkeypatch) -> None:
    from common.api import parsers

    admin = client_for(world.admin_a)
    deep = admin.generic(
        "POST", "/api/v1/tenants/tenant-a/projects/", "[" * 100_000 + "]" * 100_000, content_type="application/json"
    )
    assert deep.status_code == 400 and _envelope(deep)["code"] == "parse_error"
    nested = {"slug": "x", "name": "x", "description": {"a": {"b": {"c": 1}}}}
    for _ in range(40):
        nested = {"deeper": nested}
    too_nested = admin.post("/api/v1/tenants/tenant-a/projects/", nested, format="json")
    assert too_nested.status_code == 400 and "nested deeper" in _envelope(too_nested)["message"]
    monkeypatch.setattr(parsers, "MAX_BODY_BYTES", 1024)
    large = admin.post("/api/v1/tenants/tenant-a/projects/", {"slug": "x", "name": "x" * 2000}, format="json")
    assert large.status_code == 413 and _envelope(large)["code"] == "too_large"


def test_unbounded_strings_and_lists_are_bounded(world: World) -> None:
    from common.api.types import MAX_ITEMS, MAX_TEXT
    from tests.jobs.factories import add_node, assign

    add_node(world, "n-bounds", gpus=1)
    assign(world.member_a, world.project_a)
    body = {
        "project": "alpha",
        "pool": "shared",
        "name": "x",
        "image": "busybox:1",
        "command": ["sh", "x" * (MAX_TEXT + 1)],
        "gpu_models": ["A"] * (MAX_ITEMS + 1),
    }
    response = client_for(world.member_a).post("/api/v1/tenants/tenant-a/workloads/", body, format="json")
    assert response.status_code == 400, response.content
    assert {"command[1]", "gpu_models"} <= set(_envelope(response)["fields"])


def test_an_empty_format_is_refused_not_ignored(world: World) -> None:
    response = client_for(world.admin_a).get("/api/v1/tenants/tenant-a/projects/?format=")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert "format" in _envelope(response)["message"]


def test_a_string_is_measured_as_sent_not_after_trimming(world: World) -> None:
    # Found by the fuzz on Postgres: "\x1f" and spaces are trimmed, so a description one character too long
    # for the schema's maxLength was accepted.
    operator = client_for(world.operator)
    longest = 2000
    too_long = operator.patch("/api/v1/node-pools/shared/", {"description": " " + "d" * longest}, format="json")
    assert too_long.status_code == 400
    assert "description" in _envelope(too_long)["fields"]
    fits = operator.patch("/api/v1/node-pools/shared/", {"description": " " + "d" * (longest - 1)}, format="json")
    assert fits.status_code == 200, fits.content
