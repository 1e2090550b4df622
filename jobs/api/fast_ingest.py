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
in flight (`common.groupcommit`): one transaction, one set of ledger
reads and three writes for the whole batch, each request still accepted or
refused on its own. Bodies of 64 KiB and more (large bulk submissions) go
in a lane of their own, with `SUBMISSION_INGEST_BULK_THREADS` threads, so
they never hold up single submissions. The answer is the API view's: the same rows
(`workload_rows`), the same error envelope
(`common.api.errors.exception_handler`), the same headers (DRF's and the
middleware's) and one more, `X-Gpucloud-Path: ingest`; tests/jobs/test_fast_ingest.py holds the two
paths to that.

Any other request goes to Django untouched, the body read so far replayed,
and so does every request this path is unsure of: a refused token or
another tenant's, a role below member, a body the serializers would coerce
or refuse, a project, pool or preset that does not resolve. The client then
gets exactly the API's answer, errors included. Only reads happen before
that decision (and the token's `last_used_at`, which Django would refresh
the same way), so no request is ever carried out twice.

A fast path (docs/fastpaths.md): `GPUCLOUD_FAST_PATHS_OFF=submission_ingest`
turns it off, and DRF's view serves every submission. Every answer it gives
itself carries `X-Gpucloud-Path: ingest` (Django's carry none). Justified by
`bench/submissions.py` (single submissions a second). It depends on these
framework internals: Django's ASGI handler building an `ASGIRequest` and
its middleware chain (`request_info_for`, the middleware it runs itself),
DRF's request parsing and serializer coercion (`fast_ingest_plan.strict_body`
must accept only what they leave unchanged), DRF's renderers, throttles and
exception handler; `build_plan` checks what it can of that at start.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections, reset_queries
from django.http import HttpResponse
from rest_framework.exceptions import Throttled, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request

from common import fastpaths
from common.api.errors import error_body, exception_handler
from common.api.parsers import MAX_BODY_BYTES as API_MAX_BODY_BYTES
from common.asgitypes import ASGIApp, Message, Receive, Scope, Send
from common.groupcommit import GroupCommit
from jobs.api.fast_ingest_plan import IngestPlan, Route, build_plan
from jobs.api.serializers import prefetch_references, workload_rows
from jobs.services import Submission, SubmissionRequest, submit_batch
from tenants.authentication import ApiTokenAuthentication
from tenants.choices import Role
from tenants.context import Actor, RequestInfo, request_info
from tenants.middleware import request_info_for
from tenants.models import ApiToken
from tenants.scoping import activate_tenant, deactivate_tenant
from tenants.selectors import role_in_tenant
from tenants.services.tokens import authenticate_secrets, token_membership_role

log = logging.getLogger(__name__)

# Larger bodies go to Django as they stream in, which refuses them (413): the API's one limit.
MAX_BODY_BYTES = API_MAX_BODY_BYTES
LARGE_BODY_BYTES = 64 * 1024
"""Bodies this large (a bulk of some 300 workloads or more) take the bulk lane."""
MAX_BATCH_WEIGHT = 4096
"""About 4 MB of request bodies per batch (a request weighs one per started kilobyte), so a batch of large
bulk submissions stays one reasonable transaction."""
# The answers the ingest renders: JSON with no parameters (anything else asked for goes to Django).
_ACCEPTED_MEDIA = (None, "*/*", "application/json")


@dataclass(frozen=True)
class Incoming:
    """A submission this path may serve, as read from the wire; decided on in a batch."""

    request: ASGIRequest
    route: Route
    tenant: str
    secret: str
    body: bytes
    middleware: tuple[Any, ...]


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
    ready: list[tuple[_Parsed, SubmissionRequest]] = []
    for group in _by_tenant_and_route(_authenticated(batch)).values():
        for parsed, validated in _validated(group):
            info = request_info_for(parsed.incoming.request)
            refused = _throttled(parsed)
            if refused is not None:
                answers[parsed.index] = _answer(parsed.incoming, info, refused)
                continue
            request = SubmissionRequest(
                actor=Actor(user=parsed.token.user, token=parsed.token),
                project=validated["project"],
                items=validated["items"],
                idempotency_key=parsed.incoming.request.headers.get("Idempotency-Key"),
                bulk=parsed.incoming.route.bulk,
                role=parsed.role,
                info=info,
            )
            ready.append((parsed, request))
    outcomes = submit_batch([request for _, request in ready])
    for (parsed, request), outcome in zip(ready, outcomes, strict=True):
        assert request.info is not None
        answers[parsed.index] = _answer(parsed.incoming, request.info, outcome)
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
        if role is None or not role.at_least(incoming.route.role):
            continue
        body = incoming.route.accepted(incoming.body)
        if body is not None:
            parsed.append(_Parsed(index, incoming, token, role, *body))
    return parsed


def _by_tenant_and_route(parsed: list[_Parsed]) -> dict[tuple[int, bool], list[_Parsed]]:
    groups: dict[tuple[int, bool], list[_Parsed]] = {}
    for p in parsed:
        assert p.token.tenant_id is not None  # _authenticated keeps tenant tokens only
        groups.setdefault((p.token.tenant_id, p.incoming.route.bulk), []).append(p)
    return groups


def _validated(group: list[_Parsed]) -> list[tuple[_Parsed, dict[str, Any]]]:
    """Resolve and validate one tenant's requests of one route as the route's input serializer does.

    Inside the tenant's scope, the project field resolves every project the
    group names and `prefetch_references` every pool and preset (a query
    each); then each request runs the serializer's own `validate`. A request
    it refuses, or whose project does not resolve, goes to Django.
    """
    route = group[0].incoming.route
    tenant = group[0].token.tenant
    assert tenant is not None
    scope = activate_tenant(tenant)
    try:
        context = {"tenant": tenant}
        projects = route.project_field().objects_named({p.project for p in group}, context)
        context = prefetch_references(context, [item for p in group for item in p.items])
        validated: list[tuple[_Parsed, dict[str, Any]]] = []
        for p in group:
            project = projects.get(p.project)
            if project is None:
                continue
            items = [dict(item) for item in p.items]
            attrs = {"project": project, "items": items} if route.bulk else {**items[0], "project": project}
            try:
                done = route.new_input(context).validate(attrs)
            except ValidationError:
                continue
            items = done["items"] if route.bulk else [{k: v for k, v in done.items() if k != "project"}]
            validated.append((p, {"project": done["project"], "items": items}))
        return validated
    finally:
        deactivate_tenant(scope)


def _throttled(parsed: _Parsed) -> Throttled | None:
    """Return the refusal of the route view's own throttles (DRF's check_throttles), or None when it may go on."""
    route = parsed.incoming.route
    if not route.view.throttle_classes:
        return None
    request = Request(parsed.incoming.request)
    request.user, request.auth = parsed.token.user, parsed.token
    view = route.view()
    view.request, view.action, view.args, view.kwargs = request, "create", (), {"tenant": parsed.incoming.tenant}
    try:
        view.check_throttles(request)
    except Throttled as refused:
        return refused
    return None


def _answer(incoming: Incoming, info: RequestInfo, outcome: Submission | Exception) -> HttpResponse:
    """Return the response the API's view would give for this outcome."""
    if isinstance(outcome, Submission):
        rows = workload_rows(outcome.workloads)
        data: Any = {"count": len(rows), "results": rows} if incoming.route.bulk else rows[0]
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


def _response(incoming: Incoming, info: RequestInfo, status: int, data: Any) -> HttpResponse:
    """Return `data` rendered and headed as DRF (the view's own headers) and the response middleware head it."""
    response = HttpResponse(JSONRenderer().render(data), status=status, content_type="application/json")
    for name, value in incoming.route.headers.items():
        response[name] = value
    response["X-Request-ID"] = info.request_id
    for middleware in incoming.middleware:
        if hasattr(middleware, "process_response"):
            middleware.process_response(incoming.request, response)
    return response


# --- the ASGI side ---


def incoming(plan: IngestPlan, scope: Scope, body: bytes) -> Incoming | None:
    """Return the request as this path would serve it, or None when Django must: judged on its head only."""
    found = plan.route(scope.get("path", ""))
    if found is None or scope.get("query_string") or scope.get("root_path"):
        return None
    request = ASGIRequest(scope, io.BytesIO(body))
    try:
        request.get_host()
    except DisallowedHost:
        return None
    # A middleware's request step that answers (a redirect to HTTPS, say) is Django's to give.
    if any(hasattr(m, "process_request") and m.process_request(request) is not None for m in plan.middleware):
        return None
    if (
        request.content_type != "application/json"
        or (request.content_params or {}).get("charset", "utf-8").lower() != "utf-8"
    ):
        return None
    if request.META.get("HTTP_ACCEPT") not in _ACCEPTED_MEDIA:
        return None
    authorization = request.META.get("HTTP_AUTHORIZATION", "").split()
    if len(authorization) != 2 or authorization[0].lower() != ApiTokenAuthentication.keyword.lower():
        return None
    route, tenant = found
    return Incoming(request, route, tenant, authorization[1], body, plan.middleware)


class SubmissionIngest:
    """ASGI middleware over Django's HTTP application: serves the submissions it can (see the module)."""

    def __init__(self, app: Any, plan: IngestPlan | None = None) -> None:
        self.app: ASGIApp = app  # Django's ASGI handler
        # Derived once, here, from the API itself; when it cannot vouch for the API, every request goes to Django.
        self.plan = plan or build_plan()
        if self.plan.problems:
            problems = "; ".join(self.plan.problems)
            log.warning("the submission ingest is off; Django serves every submission: %s", problems)
        for note in self.plan.notes:
            log.info("the submission ingest defers: %s", note)
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
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or not fastpaths.enabled(fastpaths.SUBMISSION_INGEST)  # off: DRF's view serves every submission
            or self.plan.route(scope.get("path", "")) is None
        ):
            await self.app(scope, receive, send)
            return
        read = await _read_body(receive)
        if read is None:
            return  # the client went away before its request was whole
        body, complete = read
        replay = _replaying(body, complete, receive)
        candidate = incoming(self.plan, scope, body) if complete else None
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
        log.debug("served by the submission ingest: %s %s", answer.status_code, scope.get("path", ""))
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


SERVED_BY_HEADER = ("X-Gpucloud-Path", "ingest")
"""The header on every answer the ingest gives itself (none on Django's): which path served a request."""


async def _send(send: Send, response: HttpResponse) -> None:
    headers = [(name.encode("ascii"), value.encode("latin-1")) for name, value in response.items()]
    headers.append((SERVED_BY_HEADER[0].encode("ascii"), SERVED_BY_HEADER[1].encode("ascii")))
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})
