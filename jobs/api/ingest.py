"""The API's submission ingest: concurrent submissions committed together, in front of Django.

`POST /api/v1/tenants/<tenant>/workloads/` and `.../workloads/bulk/` are
the API's busiest writes. Through Django and DRF each costs a transaction
and about ten queries of its own, which held a 2-core machine near 60
submissions a second. This ASGI middleware (`gpucloud/asgi.py`) serves the
common case itself. A request

- authenticated by an API token (`Authorization: Bearer`) of the tenant in
  its path, whose owner may submit there (member or above),
- whose JSON body already is what the API's serializers would make of it
  (`strict_body`), naming a project, pools and presets that exist there,

goes to `jobs.services.submit_batch` along with every other such request
in flight (`gpucloud.groupcommit`): one transaction, one set of ledger
reads and three writes for the whole batch, each request still accepted or
refused on its own. Bodies of 64 KiB and more (large bulk submissions) go
in a lane of their own, with `SUBMISSION_INGEST_BULK_THREADS` threads, so
they never hold up single submissions. The answer is the API view's: the same rows
(`workload_rows`), the same error envelope
(`gpucloud.api.errors.exception_handler`), the same headers (DRF's and the
middleware's); tests/jobs/test_ingest.py holds the two paths to that.

Any other request goes to Django untouched, the body read so far replayed,
and so does every request this path is unsure of: a refused token or
another tenant's, a role below member, a body the serializers would coerce
or refuse, a project, pool or preset that does not resolve. The client then
gets exactly the API's answer, errors included. Only reads happen before
that decision (and the token's `last_used_at`, which Django would refresh
the same way), so no request is ever carried out twice.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections, reset_queries
from django.http import HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.security import SecurityMiddleware
from rest_framework.renderers import JSONRenderer
from rest_framework.serializers import CharField, ChoiceField, DictField, Field, IntegerField, ListField

from gpucloud.api.errors import error_body, exception_handler
from gpucloud.api.parsers import MAX_BODY_BYTES as API_MAX_BODY_BYTES
from gpucloud.asgitypes import ASGIApp, Message, Receive, Scope, Send
from gpucloud.groupcommit import GroupCommit
from inventory.models import NodePool
from jobs.api.serializers import WorkloadItemSerializer, workload_rows
from jobs.models import LaunchPreset
from jobs.services import Submission, SubmissionRequest, submit_batch
from tenants.choices import Role
from tenants.context import Actor, RequestInfo, request_info
from tenants.middleware import request_info_for
from tenants.models import ApiToken, Project
from tenants.selectors import role_in_tenant
from tenants.services.tokens import authenticate_secrets, token_membership_role

log = logging.getLogger(__name__)

ROUTE = re.compile(r"^/api/v1/tenants/(?P<tenant>[^/]+)/workloads/(?P<bulk>bulk/)?$")
# Larger bodies go to Django as they stream in, which refuses them (413): the API's one limit.
MAX_BODY_BYTES = API_MAX_BODY_BYTES
LARGE_BODY_BYTES = 64 * 1024
"""Bodies this large (a bulk of some 300 workloads or more) take the bulk lane."""
MAX_BATCH_WEIGHT = 4096
"""About 4 MB of request bodies per batch (a request weighs one per started kilobyte), so a batch of large
bulk submissions stays one reasonable transaction."""
# What DRF's finalize_response adds to the two endpoints' answers.
_ALLOW = {False: "GET, POST, HEAD, OPTIONS", True: "POST, OPTIONS"}
_ACCEPTED_MEDIA = (None, "*/*", "application/json")
_SURROGATES = re.compile("[\ud800-\udfff]")
_LARGEST_INTEGER = 2**63


@dataclass(frozen=True)
class Incoming:
    """A submission this path may serve, as read from the wire; decided on in a batch."""

    request: ASGIRequest
    tenant: str
    bulk: bool
    secret: str
    body: bytes


def _not_handled(value: Any) -> None:
    raise ValueError(value)


# --- the body, held to exactly what the serializers accept without changing it ---


def _accepts(field: Field) -> Callable[[Any], bool]:
    """Return a test of whether `field` takes a value as it is (no coercion, no error)."""
    if isinstance(field, ChoiceField):
        choices = frozenset(str(c) for c in field.choices)
        return lambda v: isinstance(v, str) and v in choices
    if isinstance(field, CharField):
        return _text_test(field)
    if isinstance(field, IntegerField):
        nullable = field.allow_null
        # The field's own bounds (gpucloud.api.fields.Integer always has them); a 64-bit range otherwise.
        lowest = -_LARGEST_INTEGER if field.min_value is None else field.min_value
        highest = _LARGEST_INTEGER - 1 if field.max_value is None else field.max_value
        return lambda v: (v is None and nullable) or (
            isinstance(v, int) and not isinstance(v, bool) and lowest <= v <= highest
        )
    if isinstance(field, ListField):
        child = _accepts(field.child)
        return lambda v: isinstance(v, list) and all(child(item) for item in v)
    if isinstance(field, DictField):
        child = _accepts(field.child)
        return lambda v: isinstance(v, dict) and all(child(item) for item in v.values())
    raise TypeError(f"no strict test for {type(field).__name__}; add one before using it in a submission")


def _text_test(field: CharField) -> Callable[[Any], bool]:
    longest, blank, trim = field.max_length, field.allow_blank, field.trim_whitespace

    def test(value: Any) -> bool:
        if not isinstance(value, str) or "\x00" in value or _SURROGATES.search(value):
            return False
        if trim and value != value.strip():
            return False
        return (blank or value != "") and (longest is None or len(value) <= longest)

    return test


_ITEM_TESTS = {name: _accepts(field) for name, field in WorkloadItemSerializer().fields.items()}
_REQUIRED = frozenset(name for name, field in WorkloadItemSerializer().fields.items() if field.required)


def strict_item(data: Any) -> dict[str, Any] | None:
    """Return the item as the item serializer would validate it (unknown keys dropped), or None when the
    serializer would change or refuse any of it."""
    if not isinstance(data, dict) or not data.keys() >= _REQUIRED:
        return None
    item = {name: value for name, value in data.items() if name in _ITEM_TESTS}
    if not all(_ITEM_TESTS[name](value) for name, value in item.items()):
        return None
    return item


def strict_body(body: bytes, *, bulk: bool) -> tuple[str, list[dict[str, Any]]] | None:
    """Return (project slug, items) of a submission body the API's serializers take as it is, else None."""
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_not_handled)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    project = data.get("project")
    if not isinstance(project, str) or not project:
        return None
    raw_items = data.get("items") if bulk else [data]
    if not isinstance(raw_items, list) or not raw_items:
        return None
    items = [strict_item(raw) for raw in raw_items]
    if any(item is None for item in items):
        return None
    return project, [item for item in items if item is not None]


# --- the batch: authenticate, resolve names, submit, answer ---


@dataclass(frozen=True)
class _Parsed:
    index: int
    incoming: Incoming
    token: ApiToken
    role: Role
    project: str
    items: list[dict[str, Any]]


def handle_batch(batch: list[Incoming]) -> list[HttpResponse | None]:
    """Answer each request of `batch`, or None for one Django must answer; one transaction for them all."""
    reset_queries()
    try:
        return _answers(batch)
    finally:
        # What the end of a request does for Django's own connections: the pool gets its connection back.
        close_old_connections()


def _answers(batch: list[Incoming]) -> list[HttpResponse | None]:
    answers: list[HttpResponse | None] = [None] * len(batch)
    parsed = _authenticated(batch)
    projects = _projects({(p.token.tenant_id, p.project) for p in parsed})
    pools = _pools({(p.token.tenant_id, item["pool"]) for p in parsed for item in p.items if "pool" in item})
    presets = _presets({(p.token.tenant_id, item["preset"]) for p in parsed for item in p.items if "preset" in item})
    ready: list[tuple[_Parsed, SubmissionRequest]] = []
    for p in parsed:
        tenant_id = p.token.tenant_id
        assert tenant_id is not None  # _authenticated keeps tenant tokens only
        project = projects.get((tenant_id, p.project))
        items = [_resolved(item, tenant_id, pools, presets) for item in p.items]
        if project is None or any(item is None for item in items):
            continue
        actor = Actor(user=p.token.user, token=p.token)
        key = p.incoming.request.headers.get("Idempotency-Key")
        request = SubmissionRequest(
            actor=actor,
            project=project,
            items=[item for item in items if item is not None],
            idempotency_key=key,
            bulk=p.incoming.bulk,
            role=p.role,
            info=request_info_for(p.incoming.request),
        )
        ready.append((p, request))
    outcomes = submit_batch([request for _, request in ready])
    for (p, request), outcome in zip(ready, outcomes, strict=True):
        assert request.info is not None
        answers[p.index] = _answer(p.incoming, request.info, outcome)
    return answers


def _authenticated(batch: list[Incoming]) -> list[_Parsed]:
    """Return the requests whose token is of the path's tenant and may submit there, with their bodies."""
    tokens = authenticate_secrets([incoming.secret for incoming in batch])
    parsed: list[_Parsed] = []
    for index, (incoming, token) in enumerate(zip(batch, tokens, strict=True)):
        if not isinstance(token, ApiToken) or token.tenant is None or token.tenant.slug != incoming.tenant:
            continue
        role = role_in_tenant(
            Actor(user=token.user, token=token), token.tenant, membership=token_membership_role(token)
        )
        if role is None or not role.at_least(Role.MEMBER):
            continue
        body = strict_body(incoming.body, bulk=incoming.bulk)
        if body is not None:
            parsed.append(_Parsed(index, incoming, token, role, *body))
    return parsed


def _projects(wanted: set[tuple[int | None, str]]) -> dict[tuple[int, str], Project]:
    """Return the projects named in the batch by (tenant id, slug), each tenant's own only; one query."""
    if not wanted:
        return {}
    rows = Project.all_tenants.filter(
        tenant_id__in={t for t, _ in wanted}, slug__in={s for _, s in wanted}
    ).select_related("tenant")
    return {(p.tenant_id, p.slug): p for p in rows if (p.tenant_id, p.slug) in wanted}


def _pools(wanted: set[tuple[int | None, str]]) -> dict[tuple[int, str], NodePool]:
    """Return the pools named in the batch by (tenant id, name) that are open to that tenant; one query."""
    if not wanted:
        return {}
    found: dict[tuple[int, str], NodePool] = {}
    for pool in NodePool.objects.filter(name__in={name for _, name in wanted}):
        for tenant_id, name in wanted:
            open_to_tenant = pool.dedicated_tenant_id is None or pool.dedicated_tenant_id == tenant_id
            if tenant_id is not None and name == pool.name and open_to_tenant:
                found[(tenant_id, name)] = pool
    return found


def _presets(wanted: set[tuple[int | None, int]]) -> dict[tuple[int, int], LaunchPreset]:
    """Return the launch presets named in the batch by (tenant id, id), each tenant's own only; one query."""
    if not wanted:
        return {}
    rows = LaunchPreset.all_tenants.filter(
        tenant_id__in={t for t, _ in wanted}, pk__in={p for _, p in wanted}
    ).select_related("pool")
    return {(p.tenant_id, p.pk): p for p in rows if (p.tenant_id, p.pk) in wanted}


def _resolved(
    item: dict[str, Any],
    tenant_id: int,
    pools: Mapping[tuple[int, str], NodePool],
    presets: Mapping[tuple[int, int], LaunchPreset],
) -> dict[str, Any] | None:
    """Return the item with its pool and preset as objects, as the serializers resolve them, or None."""
    resolved = dict(item)
    if "pool" in item:
        resolved["pool"] = pools.get((tenant_id, item["pool"]))
    if "preset" in item:
        resolved["preset"] = presets.get((tenant_id, item["preset"]))
    return None if any(resolved.get(name, True) is None for name in ("pool", "preset")) else resolved


def _answer(incoming: Incoming, info: RequestInfo, outcome: Submission | Exception) -> HttpResponse:
    """Return the response the API's view would give for this outcome."""
    if isinstance(outcome, Submission):
        rows = workload_rows(outcome.workloads)
        data: Any = {"count": len(rows), "results": rows} if incoming.bulk else rows[0]
        return _response(incoming, info, 201 if outcome.created else 200, data)
    with request_info(info):  # the envelope carries the request id
        handled = exception_handler(outcome, {})
        if handled is None:
            log.error("submission failed", exc_info=outcome)
            return _response(incoming, info, 500, error_body("server_error", "Internal server error."))
    response = _response(incoming, info, handled.status_code, handled.data)
    for name, value in handled.items():
        if name.lower() != "content-type":  # the unrendered Response's is Django's default, not the API's
            response[name] = value
    return response


def _server_error(incoming: Incoming) -> HttpResponse:
    """Return the API's 500 answer for a request whose batch failed."""
    info = request_info_for(incoming.request)
    with request_info(info):
        body = error_body(
            "server_error", "Internal server error: retry with the same Idempotency-Key to learn whether it was made."
        )
    return _response(incoming, info, 500, body)


_SECURITY = SecurityMiddleware(lambda request: HttpResponse())
_RESPONSE_MIDDLEWARE = (
    XFrameOptionsMiddleware(lambda request: HttpResponse()),
    CommonMiddleware(lambda request: HttpResponse()),
    _SECURITY,
)


def _response(incoming: Incoming, info: RequestInfo, status: int, data: Any) -> HttpResponse:
    """Return `data` rendered and headed as DRF and the middleware of settings.MIDDLEWARE head an API answer."""
    response = HttpResponse(JSONRenderer().render(data), status=status, content_type="application/json")
    response["Allow"] = _ALLOW[incoming.bulk]
    response["X-Request-ID"] = info.request_id
    for middleware in _RESPONSE_MIDDLEWARE:
        middleware.process_response(incoming.request, response)
    return response


# --- the ASGI side ---


def incoming(scope: Scope, body: bytes) -> Incoming | None:
    """Return the request as this path would serve it, or None when Django must: judged on its head only."""
    match = ROUTE.match(scope.get("path", ""))
    if match is None or scope.get("query_string") or scope.get("root_path"):
        return None
    request = ASGIRequest(scope, io.BytesIO(body))
    try:
        request.get_host()
    except DisallowedHost:
        return None
    if _SECURITY.process_request(request) is not None:  # a redirect to HTTPS
        return None
    if (
        request.content_type != "application/json"
        or (request.content_params or {}).get("charset", "utf-8").lower() != "utf-8"
    ):
        return None
    if request.META.get("HTTP_ACCEPT") not in _ACCEPTED_MEDIA:
        return None
    authorization = request.META.get("HTTP_AUTHORIZATION", "").split()
    if len(authorization) != 2 or authorization[0].lower() != "bearer":
        return None
    return Incoming(request, match["tenant"], bool(match["bulk"]), authorization[1], body)


class SubmissionIngest:
    """ASGI middleware over Django's HTTP application: serves the submissions it can (see the module)."""

    def __init__(self, app: Any) -> None:
        self.app: ASGIApp = app  # Django's ASGI handler
        # Two lanes. Small submissions (single ones, small bulks) batch together on one thread: more
        # threads only split them into smaller batches. Large bulk bodies have threads of their own, so
        # they never hold up the small ones, and one is validated while another waits on the database.
        self.batches: GroupCommit[Incoming, HttpResponse | None] = GroupCommit(
            handle_batch, name="submission-ingest", max_weight=MAX_BATCH_WEIGHT, weight=_weight
        )
        self.bulk_batches: GroupCommit[Incoming, HttpResponse | None] = GroupCommit(
            handle_batch,
            name="submission-ingest-bulk",
            max_weight=MAX_BATCH_WEIGHT,
            weight=_weight,
            workers=settings.SUBMISSION_INGEST_BULK_THREADS,
        )
        # Submissions answered here, and those passed on to Django (for tests and the curious).
        self.served = 0
        self.passed_on = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or not ROUTE.match(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        read = await _read_body(receive)
        if read is None:
            return  # the client went away before its request was whole
        body, complete = read
        replay = _replaying(body, complete, receive)
        candidate = incoming(scope, body) if complete else None
        try:
            answer = await self._lane(candidate).run(candidate) if candidate is not None else None
        except Exception:  # the batch failed as a whole (the database went away, say); GroupCommit logged it
            assert candidate is not None
            # Not passed on: whether its transaction committed is unknown, and a retry must not run it twice.
            await _send(send, _server_error(candidate))
            return
        if answer is None:
            self.passed_on += 1
            await self.app(scope, replay, send)
            return
        self.served += 1
        await _send(send, answer)

    def _lane(self, request: Incoming) -> GroupCommit[Incoming, HttpResponse | None]:
        return self.bulk_batches if len(request.body) >= LARGE_BODY_BYTES else self.batches


def _weight(request: Incoming) -> int:
    return 1 + len(request.body) // 1024


async def _read_body(receive: Receive) -> tuple[bytes, bool] | None:
    """Return (body, whether it is whole) read up to MAX_BODY_BYTES, or None when the client disconnected."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), True
        if size > MAX_BODY_BYTES:
            return b"".join(chunks), False


def _replaying(body: bytes, complete: bool, receive: Receive) -> Receive:
    """Return a receive callable that first hands over `body` (read already), then what `receive` gives."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": not complete}
        return await receive()

    return replay


async def _send(send: Send, response: HttpResponse) -> None:
    headers = [(name.encode("ascii"), value.encode("latin-1")) for name, value in response.items()]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})
