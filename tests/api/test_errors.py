"""One error format across the API, and the API's own documentation served locally."""

from __future__ import annotations

import json

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
