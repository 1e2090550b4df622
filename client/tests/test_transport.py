"""Retries, back-off and the error envelope, with failures injected through httpx.MockTransport."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from gpucloud_client import operations as ops
from gpucloud_client.aclient import AsyncClient
from gpucloud_client.client import Client
from gpucloud_client.config import Context
from gpucloud_client.errors import (
    EXIT_AUTH,
    EXIT_CONFLICT,
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    ApiError,
    ConnectionFailed,
    FieldError,
)
from gpucloud_client.transport import Call, RetryPolicy, api_error, parse_retry_after

TOKEN = "gpc_0123456789ab_abcdefghijklmnopqrstuvwxyz012345"
CONTEXT = Context("test", "http://console.test", TOKEN, tenant="acme", project="vision")
WORKLOAD = {"id": 7, "name": "train", "state": "pending", "project": "vision", "new_field": "ignored"}
ENVELOPE_400 = {
    "error": {
        "code": "validation_error",
        "message": "name: bad",
        "fields": {
            "name": [{"code": "invalid_name", "message": "Use lowercase letters."}],
            "gpus_per_replica": [{"code": "out_of_range", "message": "0 to 64."}],
        },
        "request_id": "req-1",
    }
}

Handler = Callable[[httpx.Request], httpx.Response]


def _scripted(*answers: httpx.Response | Exception) -> tuple[Handler, list[httpx.Request]]:
    """Return a handler giving `answers` in turn (raising the exceptions) and the requests it saw."""
    seen: list[httpx.Request] = []
    queue = list(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return handle, seen


def _client(handler: Handler, retries: int = 4) -> Client:
    return Client(CONTEXT, transport=httpx.MockTransport(handler), retries=retries, backoff=0)


def test_429_waits_retry_after_and_keeps_the_idempotency_key() -> None:
    handler, seen = _scripted(
        httpx.Response(429, headers={"Retry-After": "0"}, json={"error": {"code": "throttled", "message": "slow"}}),
        httpx.Response(503),
        httpx.Response(201, json=WORKLOAD),
    )

    with _client(handler) as gpc:
        workload = gpc.submit({"name": "train", "image": "img"})

    assert (workload.id, workload.state) == (7, "pending")
    assert workload.raw["new_field"] == "ignored"
    keys = {request.headers["Idempotency-Key"] for request in seen}
    assert len(seen) == 3 and len(keys) == 1 and keys.pop().startswith("gpc-")
    assert json.loads(seen[0].content) == {"project": "vision", "name": "train", "image": "img"}
    assert seen[0].headers["Authorization"] == f"Bearer {TOKEN}"
    assert seen[0].url.path == "/api/v1/tenants/acme/workloads/"


def test_connection_errors_are_retried_then_reported_without_the_token() -> None:
    refused = httpx.ConnectError("Connection refused")
    handler, seen = _scripted(refused, refused, refused)

    with _client(handler, retries=2) as gpc, pytest.raises(ConnectionFailed) as caught:
        gpc.me()

    assert len(seen) == 3
    assert caught.value.exit_code == EXIT_UNAVAILABLE
    assert "http://console.test" in caught.value.message and "Connection refused" in caught.value.message
    assert TOKEN not in str(caught.value)


def test_5xx_after_every_retry_is_unavailable() -> None:
    handler, seen = _scripted(httpx.Response(502), httpx.Response(504), httpx.Response(503, text="<html>down</html>"))

    with _client(handler, retries=2) as gpc, pytest.raises(ApiError) as caught:
        gpc.workload(7)

    assert len(seen) == 3
    assert (caught.value.status, caught.value.code, caught.value.exit_code) == (503, "http_503", EXIT_UNAVAILABLE)


@pytest.mark.parametrize(
    ("status", "exit_code"), [(400, EXIT_INVALID), (401, EXIT_AUTH), (403, EXIT_AUTH), (404, EXIT_NOT_FOUND)]
)
def test_client_errors_are_not_retried(status: int, exit_code: int) -> None:
    handler, seen = _scripted(httpx.Response(status, json={"error": {"code": "x", "message": "no"}}))

    with _client(handler) as gpc, pytest.raises(ApiError) as caught:
        gpc.cancel(7)

    assert len(seen) == 1 and caught.value.exit_code == exit_code


def test_409_is_not_retried_and_keeps_details() -> None:
    body = {"error": {"code": "illegal_transition", "message": "ended", "details": {"current_state": "succeeded"}}}
    handler, seen = _scripted(httpx.Response(409, json=body))

    with _client(handler) as gpc, pytest.raises(ApiError) as caught:
        gpc.cancel(7)

    assert len(seen) == 1
    assert (caught.value.code, caught.value.exit_code) == ("illegal_transition", EXIT_CONFLICT)
    assert caught.value.details == {"current_state": "succeeded"}
    assert seen[0].url.path == "/api/v1/tenants/acme/workloads/7/cancel/"


def test_envelope_names_every_field_with_its_rule() -> None:
    handler, _ = _scripted(httpx.Response(400, json=ENVELOPE_400))

    with _client(handler) as gpc, pytest.raises(ApiError) as caught:
        gpc.validate({"name": "Bad", "gpus_per_replica": 99})

    error = caught.value
    assert error.fields == {
        "name": [FieldError("invalid_name", "Use lowercase letters.")],
        "gpus_per_replica": [FieldError("out_of_range", "0 to 64.")],
    }
    assert error.request_id == "req-1"
    assert error.field_lines() == [
        "name: invalid_name: Use lowercase letters.",
        "gpus_per_replica: out_of_range: 0 to 64.",
    ]
    assert str(error).splitlines()[1:] == [
        "  name: invalid_name: Use lowercase letters.",
        "  gpus_per_replica: out_of_range: 0 to 64.",
    ]


def test_envelope_parsing_tolerates_what_is_not_the_envelope() -> None:
    html = api_error(502, {"X-Request-ID": "abc"}, b"<html>Bad gateway</html>")
    bare = api_error(400, {}, json.dumps({"error": {"code": "x", "message": "m", "fields": {"a": "plain"}}}).encode())

    assert (html.code, html.request_id, html.fields) == ("http_502", "abc", {})
    assert "unavailable" in html.message
    assert bare.fields == {"a": [FieldError("invalid", "plain")]}


def test_retry_policy_backs_off_doubling_and_honours_retry_after() -> None:
    policy = RetryPolicy(retries=3, backoff=0.25, jitter=lambda: 1.0)
    get = ops.me()

    assert [policy.delay(get, attempt, None) for attempt in range(4)] == [0.25, 0.5, 1.0, None]
    assert policy.delay(get, 0, 429, "7") == 7.0
    assert policy.delay(get, 0, 429, "3600") == 120.0
    assert policy.delay(get, 0, 429, "Wed, 21 Oct 2015 07:28:00 GMT") == 0.25
    assert policy.delay(get, 0, 500) is None and policy.delay(get, 0, 409) is None
    assert policy.delay(ops.validate("acme", {}), 0, 503) == 0.25


def test_retry_policy_never_repeats_a_call_that_is_not_idempotent() -> None:
    unsafe = Call("POST", "x/", lambda data: data, idempotent=False)

    assert RetryPolicy(retries=4, backoff=0).delay(unsafe, 0, 503) is None
    assert parse_retry_after(" 2 ") == 2.0 and parse_retry_after("-1") is None and parse_retry_after(None) is None


def test_lists_follow_every_page() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        page = int(request.url.params["page"])
        more = "http://console.test/next" if page < 3 else None
        return httpx.Response(200, json={"count": 3, "next": more, "results": [{**WORKLOAD, "id": page}]})

    with _client(handle) as gpc:
        workloads = gpc.workloads(state="pending", owner="ada")

    assert [w.id for w in workloads] == [1, 2, 3]


def test_no_tenant_is_a_clear_error() -> None:
    handler, seen = _scripted()
    context = Context("x", "http://console.test", TOKEN)

    with Client(context, transport=httpx.MockTransport(handler)) as gpc, pytest.raises(Exception, match="no tenant"):
        gpc.workloads()

    assert seen == []


def test_async_client_retries_the_same_way() -> None:
    handler, seen = _scripted(
        httpx.ConnectError("reset"),
        httpx.Response(429, headers={"Retry-After": "0"}),
        httpx.Response(200, json={"lines": [{"seq": 4, "text": "hi"}], "next_since": 4, "complete": True}),
    )

    async def run() -> int:
        async with AsyncClient(CONTEXT, transport=httpx.MockTransport(handler), backoff=0) as gpc:
            page = await gpc.logs(7, since=3)
        return page.lines[0].seq

    assert asyncio.run(run()) == 4
    assert len(seen) == 3 and seen[-1].url.params["since"] == "3"


def test_async_client_gives_up_like_the_sync_one() -> None:
    handler, _ = _scripted(httpx.ConnectError("refused"), httpx.ConnectError("refused"))

    async def run() -> None:
        async with AsyncClient(CONTEXT, transport=httpx.MockTransport(handler), retries=1, backoff=0) as gpc:
            await gpc.me()

    with pytest.raises(ConnectionFailed):
        asyncio.run(run())
