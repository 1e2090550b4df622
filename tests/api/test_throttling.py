"""API throttles through real requests: per token, per user (every token and session together), per anonymous address.

tests/conftest.py turns the throttles off; each test here sets small rates.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from common.api.schema import add_error_responses
from tenants import services
from tenants.context import Actor
from tests.conftest import World
from tests.gpucloud.test_settings_process import _run

ME = "/api/v1/me/"


@pytest.fixture
def rates(settings: Any) -> Any:
    """Return a function that sets the token, user and anonymous rates (None: that throttle off)."""

    def set_rates(token: str | None = None, user: str | None = None, anon: str | None = None) -> None:
        throttle_rates = {"token": token, "user": user, "anon": anon}
        settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": throttle_rates}

    return set_rates


def bearer(world: World, username: str = "member_a") -> APIClient:
    """Return a client sending a fresh API token of `username` (in its tenant)."""
    tenant = world.tenant_b if username == "admin_b" else world.tenant_a
    issued = services.create_token(
        actor=Actor(user=getattr(world, username)), tenant=tenant, name="t", role="viewer", expires_in_days=1
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    return client


def session(world: World, username: str = "member_a") -> Client:
    client = Client()
    client.force_login(getattr(world, username))
    return client


def assert_throttled(response: Any) -> None:
    assert response.status_code == 429, response.content
    error = response.json()["error"]
    assert error["code"] == "throttled"
    assert error["request_id"] == response["X-Request-ID"]
    assert 0 < int(response["Retry-After"]) <= 60


def test_a_token_over_its_rate_is_refused_while_its_owners_other_token_goes_on(world: World, rates: Any) -> None:
    rates(token="3/min", user="5/min")
    first, second = bearer(world), bearer(world)
    assert [first.get(ME).status_code for _ in range(3)] == [200, 200, 200]
    assert_throttled(first.get(ME))
    # The refused request still counts for the user, as DRF counts it: 4 of the user's 5.
    assert second.get(ME).status_code == 200
    assert_throttled(second.get(ME))  # the user's rate now, not the second token's own
    assert_throttled(session(world).get(ME))


def test_a_users_session_and_tokens_share_one_count_and_other_users_are_unaffected(world: World, rates: Any) -> None:
    rates(token="100/min", user="2/min")
    assert session(world).get(ME).status_code == 200
    assert bearer(world).get(ME).status_code == 200
    assert_throttled(bearer(world).get(ME))
    assert bearer(world, "admin_b").get(ME).status_code == 200
    assert session(world, "viewer_a").get(ME).status_code == 200


def test_anonymous_requests_are_counted_per_client_address(world: World, rates: Any) -> None:
    rates(anon="2/min")
    client = APIClient()
    assert [client.get("/api/v1/docs/").status_code for _ in range(2)] == [200, 200]
    # An X-Forwarded-For the client wrote is not believed (no proxy is trusted here).
    assert_throttled(client.get("/api/v1/docs/", HTTP_X_FORWARDED_FOR="203.0.113.9"))
    assert client.get("/api/v1/docs/", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert bearer(world).get(ME).status_code == 200, "a credential is not counted as anonymous"


def test_with_throttling_off_nothing_is_refused(world: World, rates: Any) -> None:
    rates()
    client = bearer(world)
    assert {client.get(ME).status_code for _ in range(30)} == {200}


def test_the_schema_declares_429_with_retry_after_only_while_throttling_is_on(rates: Any) -> None:
    def responses() -> dict[str, Any]:
        result: dict[str, Any] = {"paths": {"/api/v1/me/": {"get": {"responses": {"200": {}}}}}}
        return add_error_responses(result, None, None, True)["paths"]["/api/v1/me/"]["get"]["responses"]

    rates(token="10/min")
    assert "Retry-After" in responses()["429"]["headers"]
    rates()
    assert "429" not in responses()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "{'token': '1200/min', 'user': '2400/min', 'anon': '60/min'}"),
        (
            {"API_THROTTLE_TOKEN_RATE": "10/second", "API_THROTTLE_ANON_RATE": "off"},
            "{'token': '10/second', 'user': '2400/min', 'anon': None}",
        ),
        ({"API_THROTTLE": "0", "API_THROTTLE_TOKEN_RATE": "10/s"}, "{'token': None, 'user': None, 'anon': None}"),
    ],
)
def test_rates_are_read_from_the_environment(tmp_path: Any, environ: dict[str, str], expected: str) -> None:
    code = "from django.conf import settings as s; print(s.REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'])"
    result = _run(code, tmp_path, **environ)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_a_malformed_rate_stops_start_up_naming_it(tmp_path: Any) -> None:
    result = _run("from django.conf import settings; settings.DEBUG", tmp_path, API_THROTTLE_USER_RATE="100/fortnight")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "API_THROTTLE_USER_RATE" in result.stderr
