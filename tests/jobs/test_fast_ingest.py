"""The submission ingest (`jobs.api.fast_ingest`) in front of Django, held to Django's own answers.

- Served submissions: each request of a table goes once through the ingest
  and once, from the same database state, straight to Django's ASGI
  application; status, body (ids, times and request ids normalised) and
  headers must be the same, and the ingest must have answered them itself.
- Passed-on requests (bodies DRF would coerce or refuse, references that do
  not resolve, tokens that cannot submit, other credentials and headers):
  the ingest hands them to Django, body replayed, and they get Django's
  answer. Reads (GET) never reach the ingest's batches.
- Batching: concurrent submissions are committed together, each answered for
  itself; within one batch a refusal or a repeated Idempotency-Key touches
  no other request; a count limit holds however many arrive at once.
- Audit: each served submission has its own audit event, with its own
  request id.
- Revocation: a revoked token's next submission is refused.
- The switch (`FAST_PATHS["submission_ingest"]`): the parity tables run
  with the ingest on and off; its own answers carry `X-Gpucloud-Path:
  ingest`, Django's none, and switched off it reads no request at all.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from channels.routing import ProtocolTypeRouter
from django.contrib.auth.models import User
from django.db import OperationalError
from django.http import HttpResponse
from django.test import Client

from common import fastpaths
from common.bodylimit import BodyLimit
from common.groupcommit import GroupCommit
from gpucloud.asgi import application, django_asgi_app
from inventory.models import NodePool
from jobs.api.fast_ingest import Incoming, SubmissionIngest, handle_batch, incoming
from jobs.api.fast_ingest_plan import build_plan
from jobs.models import AllowedImage, LaunchPreset, Workload
from tenants import services
from tenants.context import Actor
from tenants.models import ApiToken, AuditEvent, Project, ProjectQuota, Tenant
from tests.conftest import World
from tests.jobs.factories import ready_world

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/tenants/tenant-a/workloads/"
BULK = f"{URL}bulk/"
BASE_URL = "http://localhost"
# Headers that differ between any two answers, whoever gives them; and the one saying which path served.
VOLATILE_HEADERS = frozenset({"x-request-id", "content-length", "date", "server"})
SERVED_BY = "x-gpucloud-path"
CSRF_SECRET = "csrfsecretcsrfsecretcsrfsecret32"  # 32 characters: Django accepts it unmasked

Headers = dict[str, str]
ASGIApp = Callable[..., Any]


# --- requests and answers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One request: a JSON body (bytes go as they are), sent as `auth`, a persona the `credentials` fixture names."""

    body: Any
    path: str = URL
    auth: str | None = "member"
    headers: tuple[tuple[str, str], ...] = ()
    method: str = "POST"


@dataclass(frozen=True)
class Answer:
    """A response as compared: headers lower-cased and sorted without the volatile ones, the body normalised."""

    status: int
    body: Any
    headers: list[tuple[str, str]]
    served_by: str | None  # X-Gpucloud-Path: "ingest" on the ingest's own answers, absent on Django's


# Options of a container a workload may never set: the API names each one instead of dropping it.
FORBIDDEN_KEYS: dict[str, Any] = {
    "privileged": True,
    "cap_add": ["SYS_ADMIN"],
    "binds": ["/:/host"],
    "volumes": {"/var/run/docker.sock": {"bind": "/docker.sock"}},
    "network_mode": "host",
    "pid": "host",
    "ipc": "host",
    "devices": ["/dev/mem:/dev/mem"],
    "security_opt": ["seccomp=unconfined"],
    "userns_mode": "host",
}


def job(**overrides: Any) -> dict[str, Any]:
    """Return a single submission's body: a 1-GPU batch job in alpha, pool shared."""
    return {"project": "alpha", "pool": "shared", "name": "train", "image": "busybox:1.36", **overrides}


def bulk(*items: dict[str, Any]) -> dict[str, Any]:
    return {"project": "alpha", "items": list(items)}


def item(name: str, **overrides: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox:1.36", "pool": "shared", **overrides}


def keyed(body: Any, key: str, path: str = URL) -> Call:
    return Call(body, path=path, headers=(("Idempotency-Key", key),))


def request_headers(call: Call, credentials: Mapping[str, Headers]) -> Headers:
    """Return the headers of `call`: JSON, the persona's credentials, then the call's own."""
    headers = {"Content-Type": "application/json"}
    headers.update(credentials[call.auth] if call.auth is not None else {})
    headers.update(call.headers)
    return headers


async def send(client: httpx.AsyncClient, call: Call, credentials: Mapping[str, Headers]) -> httpx.Response:
    if call.method == "GET":
        return await client.get(call.path, headers=request_headers(call, credentials))
    body = call.body if isinstance(call.body, bytes) else json.dumps(call.body).encode()
    return await client.request(call.method, call.path, content=body, headers=request_headers(call, credentials))


def one_by_one(app: ASGIApp, calls: Sequence[Call], credentials: Mapping[str, Headers]) -> list[httpx.Response]:
    """Send `calls` to the ASGI `app` in order, each after the answer to the one before."""

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL) as client:
            return [await send(client, call, credentials) for call in calls]

    return asyncio.run(run())


def all_at_once(app: ASGIApp, calls: Sequence[Call], credentials: Mapping[str, Headers]) -> list[httpx.Response]:
    """Send `calls` to the ASGI `app` concurrently; return the answers in the order of `calls`."""

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL) as client:
            return list(await asyncio.gather(*(send(client, call, credentials) for call in calls)))

    return asyncio.run(run())


def normalised(value: Any, ids: dict[int, str], request_id: str) -> Any:
    """Return `value` with workload ids numbered in order of appearance, times and this request's id masked."""
    if isinstance(value, list):
        return [normalised(v, ids, request_id) for v in value]
    if not isinstance(value, dict):
        return value
    masked: dict[str, Any] = {}
    for key, field in value.items():
        if key in ("id", "workload") and isinstance(field, int):
            masked[key] = ids.setdefault(field, f"#{len(ids) + 1}")
        elif key.endswith("_at") and field is not None:
            masked[key] = "<time>"
        elif key == "request_id" and field == request_id:
            masked[key] = "<X-Request-ID>"  # any other value stays, and differs between the two paths
        else:
            masked[key] = normalised(field, ids, request_id)
    return masked


def answers(responses: Sequence[httpx.Response]) -> list[Answer]:
    """Return the responses of one run as compared; ids are numbered across the run, so a replay shows."""
    ids: dict[int, str] = {}
    compared: list[Answer] = []
    for response in responses:
        request_id = response.headers.get("x-request-id", "")
        try:
            body = normalised(response.json(), ids, request_id)
        except json.JSONDecodeError:
            body = response.text
        headers = sorted(
            (k.lower(), v) for k, v in response.headers.multi_items() if k not in VOLATILE_HEADERS | {SERVED_BY}
        )
        compared.append(Answer(response.status_code, body, headers, response.headers.get(SERVED_BY)))
    return compared


def flat(value: Any, path: str = "") -> set[str]:
    """Return `path=value` for every scalar in a JSON value (`error.fields.name.0.code=required`)."""
    if isinstance(value, dict):
        return set().union(*(flat(v, f"{path}{k}.") for k, v in value.items()))
    if isinstance(value, list):
        return set().union(*(flat(v, f"{path}{i}.") for i, v in enumerate(value)))
    return {f"{path[:-1]}={value}"}


def forget_workloads() -> None:
    """Bring the ledger back to before a run: what a run creates is workloads (their events go with them)."""
    Workload.all_tenants.all().delete()


def counts(ingest: SubmissionIngest) -> tuple[int, int]:
    return ingest.served, ingest.passed_on


# --- the world: personas' credentials, the ingest under test ---------------------------------------------


def token(world: World, user: User, role: str, *, tenant: Tenant | None = None) -> str:
    issued = services.create_token(
        actor=Actor(user=user), tenant=tenant or world.tenant_a, name=f"{role}-token", role=role, expires_in_days=1
    )
    return issued.secret


def bearer(secret: str) -> Headers:
    return {"Authorization": f"Bearer {secret}"}


def session_of(user: User) -> Headers:
    """Return the headers of a logged-in browser session (cookie and CSRF token), no Authorization."""
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}; csrftoken={CSRF_SECRET}"
    return {"Cookie": cookie, "X-CSRFToken": CSRF_SECRET}


def revoked(world: World) -> str:
    secret = token(world, world.member_a, "member")
    revoke(world, secret)
    return secret


def revoke(world: World, secret: str) -> None:
    prefix = secret.split("_")[1]
    services.revoke_token(actor=Actor(user=world.member_a), token=ApiToken.all_tenants.get(prefix=prefix))


@pytest.fixture
def ready(world: World) -> World:
    return ready_world(world)


@pytest.fixture
def credentials(ready: World) -> dict[str, Headers]:
    """Each persona's headers: tenant A's member, admin, viewer, an admin's member token; tenant B's admin."""
    world = ready
    return {
        "member": bearer(token(world, world.member_a, "member")),
        "admin": bearer(token(world, world.admin_a, "admin")),
        "admin_as_member": bearer(token(world, world.admin_a, "member")),
        "viewer": bearer(token(world, world.viewer_a, "viewer")),
        "outsider": bearer(token(world, world.admin_b, "admin", tenant=world.tenant_b)),
        "revoked": bearer(revoked(world)),
        "malformed": bearer("gpc_nonsense"),
        "session": session_of(world.member_a),
    }


@pytest.fixture(autouse=True)
def ingest_on(settings: Any) -> None:
    """These tests are of the ingest itself: on even under GPUCLOUD_FAST_PATHS_OFF (`ingest_switch` turns it off)."""
    settings.FAST_PATHS = {**settings.FAST_PATHS, fastpaths.SUBMISSION_INGEST: True}


@pytest.fixture(params=[True, False], ids=["ingest-on", "ingest-off"])
def ingest_switch(request: pytest.FixtureRequest, settings: Any) -> bool:
    """The submission ingest's switch (common.fastpaths), on then off: parity holds both ways."""
    settings.FAST_PATHS = {**settings.FAST_PATHS, fastpaths.SUBMISSION_INGEST: request.param}
    return bool(request.param)


@pytest.fixture
def ingest() -> SubmissionIngest:
    """A fresh ingest over the console's Django application, so that its counters are this test's."""
    return SubmissionIngest(django_asgi_app)


def both_ways(
    ingest: SubmissionIngest, calls: Sequence[Call], credentials: Mapping[str, Headers]
) -> tuple[list[Answer], list[Answer]]:
    """Send `calls` through the ingest, then, from the same ledger, straight to Django; return both answers."""
    via_ingest = answers(one_by_one(ingest, calls, credentials))
    forget_workloads()
    via_django = answers(one_by_one(django_asgi_app, calls, credentials))
    return via_ingest, via_django


def assert_same_answers(via_ingest: list[Answer], via_django: list[Answer]) -> None:
    # Statuses, then bodies, then headers: a failure names the first part that differs.
    assert [a.status for a in via_ingest] == [a.status for a in via_django]
    assert [a.body for a in via_ingest] == [a.body for a in via_django]
    assert [a.headers for a in via_ingest] == [a.headers for a in via_django]


# --- arrangements beyond the ready world ---------------------------------------------------------------


def nothing(world: World) -> None:
    return None


def allow_registry_images_only(world: World) -> None:
    AllowedImage.objects.create(tenant=world.tenant_a, pattern="registry.example.com/*")


def cap_pending_at_one(world: World) -> None:
    ProjectQuota.all_tenants.filter(project=world.project_a).update(max_pending_workloads=1)


def cap_runtime_at_an_hour(world: World) -> None:
    ProjectQuota.all_tenants.filter(project=world.project_a).update(max_runtime_seconds=3600)


def add_unquoted_pool(world: World) -> None:
    NodePool.objects.create(name="spare")


def add_project_without_member(world: World) -> None:
    Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")


def add_presets(world: World) -> None:
    LaunchPreset.all_tenants.create(pk=77, tenant=world.tenant_a, name="nb", image="busybox:1.36", pool=world.pool)
    LaunchPreset.all_tenants.create(pk=78, tenant=world.tenant_b, name="nb", image="busybox:1.36", pool=world.pool)


def add_private_pool_of_b(world: World) -> None:
    NodePool.objects.create(name="private", dedicated_tenant=world.tenant_b)


def suspend_tenant_a(world: World) -> None:
    Tenant.objects.filter(pk=world.tenant_a.pk).update(is_active=False)


# --- 1. served: the same answer as Django's ------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """Calls sent in order after `arrange`; the statuses expected, and marks (`flat`) of the last answer."""

    calls: list[Call]
    statuses: list[int]
    marks: tuple[str, ...] = ()
    arrange: Callable[[World], None] = nothing


SERVED = {
    "a single submission": Case(
        [Call(job(command=["python", "train.py"], env={"SEED": "1"}))],
        [201],
        ("name=train", "state=pending", "owner=member_a", "command.1=train.py", "env.SEED=1"),
    ),
    "an admin's submission": Case([Call(job(), auth="admin")], [201], ("owner=admin_a",)),
    "a notebook": Case([Call(job(kind="notebook"))], [201], ("kind=notebook",)),
    "every field given": Case(
        [
            Call(
                job(
                    gpus_per_replica=2,
                    replicas=1,
                    gpu_models=["NVIDIA H100 80GB HBM3"],
                    cpu_milli=2000,
                    memory_mib=8192,
                    shm_mib=4096,
                    priority_class="low",
                    max_runtime_seconds=None,
                    requeue_limit=0,
                )
            )
        ],
        [201],
        ("gpus_per_replica=2", "shm_mib=4096", "priority_class=low", "requeue_limit=0"),
    ),
    "a /dev/shm larger than the memory": Case(
        [Call(job(memory_mib=1024, shm_mib=2048))], [400], ("error.fields.shm_mib.0.code=over_memory",)
    ),
    "a launch preset": Case(
        [Call({"project": "alpha", "name": "nb", "preset": 77})], [201], ("kind=notebook",), add_presets
    ),
    "a bulk submission": Case(
        [Call(bulk(item("job-0"), item("job-1", gpus_per_replica=2), item("job-2")), path=BULK)],
        [201],
        ("count=3", "results.1.gpus_per_replica=2", "results.2.name=job-2"),
    ),
    "a replayed key": Case([keyed(job(), "k-1"), keyed(job(), "k-1")], [201, 200], ("id=#1",)),
    "a replayed bulk key": Case(
        [keyed(bulk(item("a"), item("b")), "k-2", BULK), keyed(bulk(item("a"), item("b")), "k-2", BULK)],
        [201, 200],
        ("results.0.id=#1", "results.1.id=#2"),
    ),
    "a key reused with another body": Case(
        [keyed(job(), "k-3"), keyed(job(gpus_per_replica=2), "k-3")],
        [201, 409],
        ("error.code=idempotency_key_reused", "error.details.workload=#1"),
    ),
    "an empty key": Case([keyed(job(), "")], [400], ("error.fields.idempotency_key.0.code=invalid",)),
    "over the quota limit": Case(
        [Call(job(gpus_per_replica=9))], [400], ("error.fields.gpus_per_replica.0.code=above_quota_limit",)
    ),
    "a bulk item over the quota limit": Case(
        [Call(bulk(item("a"), item("b", gpus_per_replica=9)), path=BULK)],
        [400],
        ("error.fields.items[1].gpus_per_replica.0.code=above_quota_limit",),
    ),
    "an unknown GPU model": Case(
        [Call(job(gpu_models=["NVIDIA B200"]))], [400], ("error.fields.gpu_models.0.code=unknown_gpu_model",)
    ),
    "no quota in the pool": Case(
        [Call(job(pool="spare"))], [400], ("error.fields.pool.0.code=no_quota",), add_unquoted_pool
    ),
    "an image not allowed": Case(
        [Call(job())], [400], ("error.fields.image.0.code=image_not_allowed",), allow_registry_images_only
    ),
    "over the pending limit": Case(
        [Call(job(name="first")), Call(job(name="second"))],
        [201, 400],
        ("error.fields.project.0.code=max_pending_workloads",),
        cap_pending_at_one,
    ),
    "over the maximum runtime": Case(
        [Call(job(max_runtime_seconds=7200))],
        [400],
        ("error.fields.max_runtime_seconds.0.code=above_max_runtime",),
        cap_runtime_at_an_hour,
    ),
    "a name the field rules refuse": Case(
        [Call(job(name="Not_A_Name"))], [400], ("error.fields.name.0.code=invalid_name",)
    ),
    "no pool at all": Case(
        [Call({"project": "alpha", "name": "x", "image": "busybox:1"})], [400], ("error.fields.pool.0.code=required",)
    ),
    "a member outside the project": Case(
        [Call(job(project="gamma"))], [403], ("error.code=permission_denied",), add_project_without_member
    ),
    "an admin's member token outside the project": Case(
        [Call(job(), auth="admin_as_member")], [403], ("error.code=permission_denied",)
    ),
}


@pytest.mark.parametrize("case", SERVED.values(), ids=SERVED.keys())
def test_a_submission_the_ingest_serves_gets_the_answer_django_gives(
    ready: World, credentials: dict[str, Headers], ingest_switch: bool, ingest: SubmissionIngest, case: Case
) -> None:
    case.arrange(ready)
    via_ingest, via_django = both_ways(ingest, case.calls, credentials)
    if ingest_switch:
        assert counts(ingest) == (len(case.calls), 0), "the ingest passed on a submission it should serve"
        assert [a.served_by for a in via_ingest] == ["ingest"] * len(case.calls)
    else:  # switched off, DRF's view serves every submission, and says nothing of it
        assert counts(ingest) == (0, 0), "the ingest looked at a submission while switched off"
        assert [a.served_by for a in via_ingest] == [None] * len(case.calls)
    assert [a.served_by for a in via_django] == [None] * len(case.calls)
    assert [a.status for a in via_ingest] == case.statuses, via_ingest[-1].body
    assert set(case.marks) <= flat(via_ingest[-1].body), via_ingest[-1].body
    assert_same_answers(via_ingest, via_django)


# --- 2. passed on: Django's answer, body replayed ---------------------------------------------------------


PASSED_ON = {
    "malformed JSON": Case([Call(b'{"project": "alpha", "name": ')], [400], ("error.code=parse_error",)),
    "NaN in the body": Case(
        [Call(b'{"project": "alpha", "pool": "shared", "name": "x", "image": "busybox:1", "cpu_milli": NaN}')],
        [400],
        ("error.code=parse_error",),
    ),
    "a number as a string": Case(
        [Call(job(gpus_per_replica="2"))], [400], ("error.fields.gpus_per_replica.0.message=Must be a whole number.",)
    ),
    "a whole float": Case([Call(job(gpus_per_replica=2.0))], [201], ("gpus_per_replica=2",)),
    "a name with spaces around it": Case([Call(job(name="  train "))], [201], ("name=train",)),
    "a bulk item of the wrong type": Case(
        [Call(bulk(item("a"), item("b", replicas="1")), path=BULK)],
        [400],
        ("error.fields.items[1].replicas.0.message=Must be a whole number.",),
    ),
    "a missing name": Case(
        [Call({"project": "alpha", "pool": "shared", "image": "busybox:1"})],
        [400],
        ("error.fields.name.0.code=required",),
    ),
    "container options the API refuses": Case(
        [Call(job(**FORBIDDEN_KEYS))],
        [400],
        tuple(f"error.fields.{key}.0.code=unknown_field" for key in FORBIDDEN_KEYS),
    ),
    "container options in bulk items and beside them": Case(
        [Call({**bulk(item("a", privileged=True), item("b", host_config={"pid": "host"})), "pid": "host"}, path=BULK)],
        [400],
        (
            "error.fields.items[0].privileged.0.code=unknown_field",
            "error.fields.items[1].host_config.0.code=unknown_field",
            "error.fields.pid.0.code=unknown_field",
        ),
    ),
    "an empty bulk": Case([Call(bulk(), path=BULK)], [400], ("error.fields.items.non_field_errors.0.code=empty",)),
    "an unknown project": Case([Call(job(project="nowhere"))], [400], ("error.fields.project.0.code=does_not_exist",)),
    "another tenant's project": Case(
        [Call(job(project="beta"))], [400], ("error.fields.project.0.code=does_not_exist",)
    ),
    "an unknown pool": Case([Call(job(pool="nowhere"))], [400], ("error.fields.pool.0.code=does_not_exist",)),
    "a pool dedicated to another tenant": Case(
        [Call(job(pool="private"))], [400], ("error.fields.pool.0.code=does_not_exist",), add_private_pool_of_b
    ),
    "another tenant's preset": Case(
        [Call({"project": "alpha", "name": "nb", "preset": 78})],
        [400],
        ("error.fields.preset.0.code=does_not_exist",),
        add_presets,
    ),
    "a revoked token": Case([Call(job(), auth="revoked")], [401], ("error.code=authentication_failed",)),
    "a malformed token": Case([Call(job(), auth="malformed")], [401], ("error.code=authentication_failed",)),
    "another tenant's token": Case([Call(job(), auth="outsider")], [404], ("error.code=not_found",)),
    "a viewer's token": Case([Call(job(), auth="viewer")], [403], ("error.code=permission_denied",)),
    "a suspended tenant": Case([Call(job())], [401], ("error.code=authentication_failed",), suspend_tenant_a),
    "a session cookie": Case([Call(job(), auth="session")], [201], ("owner=member_a",)),
    "no credentials": Case([Call(job(), auth=None)], [401], ("error.code=not_authenticated",)),
    "a query string": Case([Call(job(), path=f"{URL}?dry=1")], [201], ("name=train",)),
    "an HTML Accept header": Case([Call(job(), headers=(("Accept", "text/html"),))], [406], ()),
    "indented JSON asked for": Case([Call(job(), headers=(("Accept", "application/json; indent=2"),))], [201], ()),
    "a text body": Case([Call(b"alpha", headers=(("Content-Type", "text/plain"),))], [415], ()),
    "a form body": Case(  # the API reads JSON only
        [Call(b"project=alpha&name=x", headers=(("Content-Type", "application/x-www-form-urlencoded"),))],
        [415],
        ("error.code=unsupported_media_type",),
    ),
}


@pytest.mark.parametrize("case", PASSED_ON.values(), ids=PASSED_ON.keys())
def test_a_request_the_ingest_is_unsure_of_gets_djangos_own_answer(
    ready: World, credentials: dict[str, Headers], ingest_switch: bool, ingest: SubmissionIngest, case: Case
) -> None:
    case.arrange(ready)
    via_ingest, via_django = both_ways(ingest, case.calls, credentials)
    passed_on = len(case.calls) if ingest_switch else 0  # switched off, the ingest never reads a request
    assert counts(ingest) == (0, passed_on), "the ingest served a request it should pass on"
    assert [a.served_by for a in via_ingest + via_django] == [None] * 2 * len(case.calls)
    assert [a.status for a in via_ingest] == case.statuses, via_ingest[-1].body
    assert set(case.marks) <= flat(via_ingest[-1].body), via_ingest[-1].body
    assert_same_answers(via_ingest, via_django)


def test_a_read_of_the_same_path_never_reaches_the_ingest(
    ready: World, credentials: dict[str, Headers], ingest: SubmissionIngest
) -> None:
    [created] = one_by_one(ingest, [Call(job())], credentials)
    [listed] = one_by_one(ingest, [Call(None, method="GET")], credentials)
    assert listed.status_code == 200
    assert [w["id"] for w in listed.json()["results"]] == [created.json()["id"]]
    assert counts(ingest) == (1, 0)
    assert ingest.batches.items == 1


def test_the_console_application_puts_the_ingest_in_front_of_django(
    ready: World, credentials: dict[str, Headers]
) -> None:
    limited = application.app
    assert isinstance(limited, BodyLimit)  # request bodies limited first (common.bodylimit)
    router = limited.app
    assert isinstance(router, ProtocolTypeRouter)
    ingest = router.application_mapping["http"]
    assert isinstance(ingest, SubmissionIngest) and ingest.app is django_asgi_app
    served = ingest.served
    [response] = one_by_one(application, [Call(job())], credentials)
    assert response.status_code == 201
    assert ingest.served == served + 1


# --- 3. batches ----------------------------------------------------------------------------------------


def test_concurrent_submissions_are_committed_together_each_answered_for_itself(
    ready: World, credentials: dict[str, Headers], ingest: SubmissionIngest
) -> None:
    names = [f"job-{i:02d}" for i in range(40)]
    responses = all_at_once(ingest, [Call(job(name=name)) for name in names], credentials)
    assert [r.status_code for r in responses] == [201] * len(names)
    assert [r.json()["name"] for r in responses] == names
    stored = dict(Workload.all_tenants.values_list("pk", "name"))
    assert {r.json()["id"]: r.json()["name"] for r in responses} == stored  # each id is its own request's, once
    assert counts(ingest) == (len(names), 0)
    assert ingest.batches.items == len(names)
    assert ingest.batches.batches < ingest.batches.items, "no two submissions were committed together"


def test_large_bulk_submissions_take_their_own_lane_beside_single_ones(
    ready: World, credentials: dict[str, Headers], ingest: SubmissionIngest
) -> None:
    # Two bulks of 300 workloads with long commands: bodies over 64 KiB.
    calls = [
        Call(bulk(*[item(f"bulk-{b}-{n:03d}", command=["x" * 200]) for n in range(300)]), path=BULK) for b in range(2)
    ]
    calls += [Call(job(name=f"single-{i}")) for i in range(6)]
    responses = all_at_once(ingest, calls, credentials)
    assert [r.status_code for r in responses] == [201] * len(calls)
    assert [r.json()["count"] for r in responses[:2]] == [300, 300]
    assert (ingest.bulk_batches.items, ingest.batches.items) == (2, 6)
    assert Workload.all_tenants.count() == 606


def scope(call: Call, credentials: Mapping[str, Headers]) -> dict[str, Any]:
    """Return the ASGI scope of `call` as a server would give it to the ingest."""
    headers = {"Host": "localhost", **request_headers(call, credentials)}
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": call.path,
        "raw_path": call.path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("localhost", 80),
    }


def in_one_batch(calls: Sequence[Call], credentials: Mapping[str, Headers]) -> list[tuple[int, Any] | None]:
    """Hand `calls` to the ingest's batch handler as one batch; return each answer's (status, body), or None."""
    batch = []
    for call in calls:
        request = incoming(build_plan(), scope(call, credentials), json.dumps(call.body).encode())
        assert request is not None, call
        batch.append(request)
    return [None if r is None else (r.status_code, json.loads(r.content)) for r in handle_batch(batch)]


def test_in_one_batch_each_request_is_accepted_or_refused_on_its_own(
    ready: World, credentials: dict[str, Headers]
) -> None:
    calls = [
        Call(job(name="first")),
        Call(job(name="too-big", gpus_per_replica=9)),
        keyed(job(name="keyed"), "same"),
        keyed(job(name="keyed"), "same"),
        keyed(job(name="clash"), "other"),
        keyed(job(name="clash", gpus_per_replica=2), "other"),
        Call(job(name="seen-by-viewer"), auth="viewer"),
        Call(job(name="nowhere", project="nowhere")),
        Call(bulk(item("bulk-0"), item("bulk-1")), path=BULK),
        Call(job(name="last")),
    ]
    results = in_one_batch(calls, credentials)
    assert [r and r[0] for r in results] == [201, 400, 201, 200, 201, 409, None, None, 201, 201]
    bodies = {index: r[1] for index, r in enumerate(results) if r is not None}
    assert bodies[3]["id"] == bodies[2]["id"]
    assert bodies[5]["error"]["details"]["workload"] == bodies[4]["id"]
    assert bodies[1]["error"]["fields"]["gpus_per_replica"][0]["code"] == "above_quota_limit"
    names = sorted(Workload.all_tenants.values_list("name", flat=True))
    assert names == ["bulk-0", "bulk-1", "clash", "first", "keyed", "last"]


def test_submissions_arriving_together_at_a_pending_limit_create_exactly_that_many(
    ready: World, credentials: dict[str, Headers], ingest: SubmissionIngest
) -> None:
    limit = 5
    ProjectQuota.all_tenants.filter(project=ready.project_a).update(max_pending_workloads=limit)
    responses = all_at_once(ingest, [Call(job(name=f"job-{i:02d}")) for i in range(limit + 10)], credentials)
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] * limit + [400] * 10
    refusals = {r.json()["error"]["fields"]["project"][0]["code"] for r in responses if r.status_code == 400}
    assert refusals == {"max_pending_workloads"}
    assert Workload.all_tenants.count() == limit


@pytest.mark.postgres
def test_the_pending_limit_holds_across_the_ingest_and_django_together(
    ready: World, credentials: dict[str, Headers], ingest: SubmissionIngest
) -> None:
    limit = 5
    ProjectQuota.all_tenants.filter(project=ready.project_a).update(max_pending_workloads=limit)
    # Every other request carries a query string, so Django serves it, concurrently with the ingest's batches.
    paths = [URL if i % 2 else f"{URL}?via=django" for i in range(limit + 15)]
    calls = [Call(job(name=f"job-{i:02d}"), path=path) for i, path in enumerate(paths)]
    responses = all_at_once(ingest, calls, credentials)
    assert sorted(r.status_code for r in responses).count(201) == limit
    assert Workload.all_tenants.count() == limit
    assert ingest.served > 0 and ingest.passed_on > 0


# --- 4. audit ------------------------------------------------------------------------------------------


def test_each_served_submission_is_audited_with_its_own_request_id(
    ready: World, credentials: dict[str, Headers], ingest: SubmissionIngest
) -> None:
    request_ids = [f"req-{i:06d}aa" for i in range(12)]
    calls = [Call(job(name=f"job-{i:02d}"), headers=(("X-Request-ID", rid),)) for i, rid in enumerate(request_ids)]
    responses = all_at_once(ingest, calls, credentials)
    assert [r.headers["x-request-id"] for r in responses] == request_ids
    assert counts(ingest) == (len(calls), 0)
    prefix = credentials["member"]["Authorization"].split("_")[1]
    for request_id, response in zip(request_ids, responses, strict=True):
        [event] = AuditEvent.all_tenants.filter(action="workload.submit", object_id=str(response.json()["id"]))
        assert (event.request_id, event.via, event.actor_id) == (request_id, "api", ready.member_a.pk)
        assert event.token_prefix == prefix
        assert event.after == {"project": "alpha", "count": 1, "ids": [response.json()["id"]]}


# --- 5. revocation ---------------------------------------------------------------------------------------


def test_a_revoked_token_is_refused_on_its_next_submission(
    ready: World, credentials: dict[str, Headers], ingest: SubmissionIngest
) -> None:
    assert [r.status_code for r in one_by_one(ingest, [Call(job(name="before"))], credentials)] == [201]
    revoke(ready, credentials["member"]["Authorization"].removeprefix("Bearer "))
    [refused] = one_by_one(ingest, [Call(job(name="after"))], credentials)
    assert refused.status_code == 401
    assert refused.json()["error"]["message"] == "This API token was revoked."
    assert counts(ingest) == (1, 1)
    assert list(Workload.all_tenants.values_list("name", flat=True)) == ["before"]


# --- 6. a batch that fails as a whole ------------------------------------------------------------------------


def test_a_batch_that_fails_as_a_whole_is_a_500_envelope_and_never_goes_to_django(
    ready: World, credentials: dict[str, Headers], ingest: SubmissionIngest
) -> None:
    def database_gone(batch: list[Incoming]) -> list[HttpResponse | None]:
        raise OperationalError("the server closed the connection")  # failure injection: the database went away

    ingest.batches = GroupCommit(database_gone, name="failing-ingest", max_weight=10)
    [answer] = one_by_one(ingest, [Call(job(name="lost"), headers=(("X-Request-ID", "req-gone0001"),))], credentials)
    assert answer.status_code == 500
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["error"]["code"] == "server_error"
    assert answer.json()["error"]["request_id"] == "req-gone0001"
    # Passing it on could make the submission twice, had the failed batch committed after all.
    assert counts(ingest) == (0, 0)
    assert not Workload.all_tenants.exists()
