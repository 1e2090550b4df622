"""The notebook proxy, served by uvicorn on loopback in front of a real Jupyter server started by the process runtime.

Who gets through (owner, tenant admins) and who gets the same 404 or
refused handshake as for a notebook that does not exist (anonymous,
another tenant, other members, operators); a kernel started and run
through the proxy; what crosses it (headers, cookies, the secret, bodies,
frames, closes) against a header-echoing upstream; upstream failures.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, override_settings
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect
from websockets.sync.connection import Connection
from websockets.sync.server import ServerConnection, serve

from common.origins import parse_origin_pattern
from gpucloud.asgi import application
from inventory.drivers.base import WorkloadSpec
from inventory.drivers.process import ProcessRuntime
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Replica, Workload
from jobs.proxy import SecretMask
from jobs.selectors import notebook_proxy_target
from jobs.services.execution import container_name
from tenants.models import Membership, Tenant
from tests.api.test_contract import LOSS, _dual, _user
from tests.conftest import World
from tests.frontend.live import token_for
from tests.jobs.factories import add_node
from tests.process_user import reachable_dir, workload_python
from tests.workers import uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)

JUPYTER_ID = 4242
ECHO_ID = 4343
SECRET = secrets.token_urlsafe(32)


# --- servers: Jupyter, the console, a header-echoing upstream ------------------------------------------


def jupyter_spec(workload_id: int, secret: str) -> WorkloadSpec:
    """Return the spec of a Jupyter server as a notebook runs it: token and port from the environment."""
    command = [
        *workload_python(),
        "-m",
        "jupyter_server",
        f"--ServerApp.base_url=/notebooks/{workload_id}/",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port_retries=0",
        "--no-browser",
        "--allow-root",  # test machines may run as root; the process runtime runs as whoever runs the agent
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ]
    return WorkloadSpec(
        name=f"gpucloud-w{workload_id}-r0-a1-{uuid.uuid4().hex[:6]}",
        workload_id=str(workload_id),
        tenant="tenant-a",
        attempt=1,
        image="unused",
        command=command,
        env={"JUPYTER_TOKEN": secret},
        service_port=8888,
        service_port_env="JUPYTER_PORT",
    )


def wait_until_serving(runtime: ProcessRuntime, handle: dict[str, Any], path: str, secret: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(handle["endpoint"] + path, headers={"Authorization": f"token {secret}"}, timeout=5)
            if answer.status_code == 200:
                return
        except httpx.TransportError:
            pass
        if runtime.poll(handle).state == "exited":
            break
        time.sleep(0.2)
    output = "\n".join(line.text for line in runtime.logs(handle))[-3000:]
    pytest.fail(f"Jupyter did not start:\n{output}")


@pytest.fixture(scope="module")
def jupyter() -> Iterator[str]:
    """A Jupyter server for notebook JUPYTER_ID started through the process runtime; yields its endpoint."""
    runtime = ProcessRuntime(reachable_dir(), enabled=True)
    handle = runtime.start(jupyter_spec(JUPYTER_ID, SECRET))
    try:
        wait_until_serving(runtime, handle, f"/notebooks/{JUPYTER_ID}/api/status", SECRET)
        yield handle["endpoint"]
    finally:
        runtime.remove(handle, timeout=10)


@pytest.fixture(scope="module")
def console() -> Iterator[str]:
    """The console's ASGI application under uvicorn on a free loopback port; yields the console's base URL.

    The same server is the notebook origin under another host name (`notebook_origin`): the proxy tells
    them apart by the Host header, as it does behind a reverse proxy.
    """
    with uvicorn_server(application) as url, override_settings(NOTEBOOK_ORIGIN=parse_origin_pattern(notebooks_of(url))):
        yield url


def notebooks_of(console: str) -> str:
    """Return the notebook origin of the test console at `console`: the same port, another host name."""
    return console.replace("127.0.0.1", "localhost")


@dataclass
class Echo:
    """What the echoing upstream received: HTTP requests and WebSocket connections."""

    endpoint: str
    websockets_endpoint: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    websockets: list[dict[str, Any]] = field(default_factory=list)
    stream_ended: threading.Event = field(default_factory=threading.Event)


def _echo_handler(echo: Echo) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _stream(self) -> None:
            """Send chunks until the reader goes away, then say so."""
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
                    time.sleep(0.005)
            except OSError:
                echo.stream_ended.set()

        def _answer(self) -> None:
            if self.path.endswith("/stream"):
                self._stream()
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen = {"method": self.command, "path": self.path, "headers": dict(self.headers.items()), "body": body}
            echo.requests.append(seen)
            payload = json.dumps({"path": self.path, "authorization": self.headers.get("Authorization")}).encode()
            self.send_response(200)
            for cookie in ("sessionid=planted; Path=/", "username-127-0-0-1=credential; Path=/", "_xsrf=x; Path=/"):
                self.send_header("Set-Cookie", cookie)
            self.send_header("X-Echo-Token", f"token={SECRET}")
            self.send_header("Keep-Alive", "timeout=5")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def _echo_frames(echo: Echo, connection: ServerConnection) -> None:
    """Echo every frame; `close <code>` makes the upstream close with that code."""
    request = connection.request
    assert request is not None  # the handler runs after the handshake
    seen: dict[str, Any] = {"path": request.path, "headers": dict(request.headers.raw_items())}
    echo.websockets.append(seen)
    try:
        for message in connection:
            if isinstance(message, str) and message.startswith("close "):
                connection.close(int(message.split()[1]), "upstream closes")
                break
            connection.send(message)
    except ConnectionClosed:
        pass  # the browser's side closed with a code other than 1000
    seen["close_code"] = connection.close_code


@pytest.fixture(scope="module")
def echo() -> Iterator[Echo]:
    """An upstream on one port that echoes HTTP requests (and records them) and WebSocket frames."""
    http_server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    ws_server = serve(lambda connection: _echo_frames(recorded, connection), "127.0.0.1", 0)
    recorded = Echo(
        endpoint=f"http://127.0.0.1:{http_server.server_address[1]}",
        websockets_endpoint=f"http://127.0.0.1:{ws_server.socket.getsockname()[1]}",
    )
    http_server.RequestHandlerClass = _echo_handler(recorded)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (http_server, ws_server)]
    for thread in threads:
        thread.start()
    yield recorded
    http_server.shutdown()
    ws_server.shutdown()


# --- rows and clients ------------------------------------------------------------------------------------


def notebook(world: World, workload_id: int, endpoint: str, *, owner: User | None = None, **fields: Any) -> Workload:
    """Create a running notebook of tenant A (owned by member_a) whose first replica serves at `endpoint`."""
    defaults: dict[str, Any] = {
        "kind": WorkloadKind.NOTEBOOK,
        "state": WorkloadState.RUNNING,
        "session_secret": SECRET,
        "service_port": 8888,
    }
    workload = Workload.all_tenants.create(
        pk=workload_id,
        tenant=world.tenant_a,
        project=world.project_a,
        owner=owner or world.member_a,
        name="nb",
        image="jupyter",
        pool=world.pool,
        **(defaults | fields),
    )
    Replica.all_tenants.create(
        tenant=world.tenant_a,
        workload=workload,
        attempt=workload.attempt,
        index=0,
        node=add_node(world, f"node-{workload_id}", gpus=0),
        name=container_name(workload_id, 0, workload.attempt),
        endpoint=endpoint,
        state="running",
    )
    return workload


def browser(console: str, user: User | None, *workloads: int) -> httpx.Client:
    """Return an HTTP client on the notebook origin that entered `workloads` (default: both test notebooks)
    through the console's hand-off as `user` (none for anonymous), where the console let it.

    It also carries the console's session and CSRF cookies and a foreign one, as a browser on the same host
    sends them to another port: the proxy must pass on only the foreign one.
    """
    cookies = {settings.CSRF_COOKIE_NAME: "console-csrf-token", "theme": "dark"}
    if user is not None:
        login = Client()
        login.force_login(user)
        cookies[settings.SESSION_COOKIE_NAME] = login.cookies[settings.SESSION_COOKIE_NAME].value
    origin = str(settings.NOTEBOOK_ORIGIN.origin_of(1)) if settings.NOTEBOOK_ORIGIN else console
    entries = []
    with httpx.Client(base_url=console, cookies=cookies, timeout=30) as on_console:
        for workload in workloads or (JUPYTER_ID, ECHO_ID):
            handed = on_console.get(f"/notebooks/{workload}/open")
            if handed.status_code == 302 and "gpucloud-enter" in handed.headers["location"]:
                entry = urlsplit(handed.headers["location"])
                origin = f"{entry.scheme}://{entry.netloc}"
                entries.append(handed.headers["location"])
    jar = httpx.Cookies(cookies)
    with httpx.Client(cookies=jar, timeout=30) as entering:
        for entry_url in entries:
            entered = entering.get(entry_url)
            assert entered.status_code == 303, entered.text
        jar = entering.cookies
    return httpx.Client(base_url=origin, cookies=jar, headers={"Origin": origin}, timeout=30)


def websocket(console: str, client: httpx.Client, path: str) -> ClientConnection:
    """Open a WebSocket at `path` on `client`'s origin (the notebook origin) with the cookies a browser sends there."""
    del console  # the notebook origin is the client's
    origin = str(client.base_url).rstrip("/")
    cookie = "; ".join(f"{c.name}={c.value}" for c in client.cookies.jar if path.startswith(c.path or "/"))
    url = origin.replace("http", "ws", 1) + path
    return ws_connect(url, additional_headers={"Cookie": cookie}, origin=origin, open_timeout=30)  # type: ignore[arg-type]


def refused_handshake(console: str, client: httpx.Client, path: str) -> int:
    """Return the HTTP status that refused the WebSocket handshake; fails the test if it was accepted."""
    with pytest.raises(InvalidStatus) as refused:
        websocket(console, client, path).close()
    return refused.value.response.status_code


def another_member(world: World) -> User:
    user = User.objects.create_user("member_a2", "m2@example.com", "x")
    Membership.all_tenants.create(tenant=world.tenant_a, user=user, role="member")
    return user


def execute(connection: Connection, code: str) -> str:
    """Run `code` through Jupyter's kernel channels protocol; return the execute_result's text/plain."""
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "msg_type": "execute_request",
        "username": "test",
        "session": uuid.uuid4().hex,
        "date": datetime.now(UTC).isoformat(),
        "version": "5.3",
    }
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
    connection.send(json.dumps(message))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reply = json.loads(connection.recv(timeout=60))
        if reply.get("parent_header", {}).get("msg_id") == msg_id and reply["msg_type"] == "execute_result":
            return str(reply["content"]["data"]["text/plain"])
    raise AssertionError("no execute_result")


def wait_for(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def shows_no_secret(response: httpx.Response) -> bool:
    headers = "\n".join(f"{k}: {v}" for k, v in response.headers.multi_items())
    return SECRET not in response.text and SECRET not in headers


# --- against a real Jupyter server ------------------------------------------------------------------------


def test_the_owner_reaches_the_status_and_the_lab_page_without_seeing_the_secret(
    world: World, jupyter: str, console: str
) -> None:
    notebook(world, JUPYTER_ID, jupyter)
    with browser(console, world.member_a) as owner:
        status = owner.get(f"/notebooks/{JUPYTER_ID}/api/status")
        assert status.status_code == 200 and "started" in status.json()
        lab = owner.get(f"/notebooks/{JUPYTER_ID}/lab")
    assert lab.status_code == 200 and "<html" in lab.text.lower()
    # JupyterLab writes its token into the page: the proxy masked it.
    assert f'"token": "{"*" * len(SECRET)}"' in lab.text
    for response in (status, lab):
        assert shows_no_secret(response)
        assert "username-" not in response.headers.get("set-cookie", ""), "Jupyter's login cookie is a credential"


def test_a_kernel_started_through_the_proxy_computes_over_the_proxied_websocket(
    world: World, jupyter: str, console: str
) -> None:
    notebook(world, JUPYTER_ID, jupyter)
    with browser(console, world.member_a) as owner:
        started = owner.post(f"/notebooks/{JUPYTER_ID}/api/kernels", json={"name": "python3"})
        assert started.status_code == 201, started.text
        kernel = started.json()["id"]
        try:
            with websocket(console, owner, f"/notebooks/{JUPYTER_ID}/api/kernels/{kernel}/channels") as channels:
                assert execute(channels, "1+1") == "2"
                assert execute(channels, f"'{SECRET[:8]}' + '{SECRET[8:]}'") == f"'{'*' * len(SECRET)}'"
        finally:
            assert owner.delete(f"/notebooks/{JUPYTER_ID}/api/kernels/{kernel}").status_code == 204
        assert shows_no_secret(started)


@pytest.mark.parametrize("who", ["anonymous", "outsider", "other_member", "viewer", "operator"])
def test_everyone_but_the_owner_and_tenant_admins_gets_404_and_a_refused_handshake(
    world: World, jupyter: str, console: str, who: str
) -> None:
    notebook(world, JUPYTER_ID, jupyter)
    users = {"anonymous": None, "outsider": world.admin_b, "viewer": world.viewer_a, "operator": world.operator}
    user = another_member(world) if who == "other_member" else users[who]
    with browser(console, user) as client:
        for path in ("api/status", "api/kernels", "lab", "static/nothing.js"):
            answer = client.get(f"/notebooks/{JUPYTER_ID}/{path}")
            assert (answer.status_code, answer.text) == (404, "Not found."), path
        assert client.post(f"/notebooks/{JUPYTER_ID}/api/kernels", json={}).status_code == 404
        assert refused_handshake(console, client, f"/notebooks/{JUPYTER_ID}/api/events/subscribe") == 403


def test_a_tenant_admin_gets_through_and_losing_the_role_takes_effect_at_once(
    world: World, jupyter: str, console: str
) -> None:
    notebook(world, JUPYTER_ID, jupyter)
    with browser(console, world.admin_a) as admin:
        assert admin.get(f"/notebooks/{JUPYTER_ID}/api/status").status_code == 200
        websocket(console, admin, f"/notebooks/{JUPYTER_ID}/api/events/subscribe").close()
        Membership.all_tenants.filter(user=world.admin_a).update(role="member")
        assert admin.get(f"/notebooks/{JUPYTER_ID}/api/status").status_code == 404
        assert refused_handshake(console, admin, f"/notebooks/{JUPYTER_ID}/api/events/subscribe") == 403


def test_an_owner_removed_from_the_tenant_or_made_a_viewer_loses_the_notebook(
    world: World, jupyter: str, console: str
) -> None:
    notebook(world, JUPYTER_ID, jupyter)
    with browser(console, world.member_a) as owner:
        assert owner.get(f"/notebooks/{JUPYTER_ID}/api/status").status_code == 200
        Membership.all_tenants.filter(user=world.member_a).update(role="viewer")
        assert owner.get(f"/notebooks/{JUPYTER_ID}/api/status").status_code == 404
        Membership.all_tenants.filter(user=world.member_a).delete()
        assert owner.get(f"/notebooks/{JUPYTER_ID}/api/status").status_code == 404
        assert refused_handshake(console, owner, f"/notebooks/{JUPYTER_ID}/api/events/subscribe") == 403


# --- the permission contract over the proxy: two tenants, a deactivated tenant, a removed member ----------


def test_a_user_of_two_tenants_reaches_tenant_as_notebooks_by_session_and_no_token_opens_any(
    world: World, echo: Echo, console: str
) -> None:
    """dual administers tenants A and B: its session reaches A's notebook. The proxy takes the console's
    session only: a bearer token, whichever tenant it is bound to, is no login there."""
    notebook(world, ECHO_ID, echo.endpoint)
    dual = _dual(world)
    reached = len(echo.requests)
    with browser(console, dual) as session:
        assert session.get(f"/notebooks/{ECHO_ID}/api/status").status_code == 200
    for tenant in (world.tenant_a, world.tenant_b):
        secret = token_for(dual, tenant, "admin")
        with browser(console, None) as client:
            client.headers["Authorization"] = f"Bearer {secret}"
            assert client.get(f"/notebooks/{ECHO_ID}/api/status").status_code == 404
            assert refused_handshake(console, client, f"/notebooks/{ECHO_ID}/api/events/subscribe") == 403
    assert len(echo.requests) == reached + 1, "only the session's request reached the notebook"


@pytest.mark.parametrize("scenario", sorted(LOSS))
def test_a_deactivated_tenant_or_a_removed_member_reaches_no_notebook(
    world: World, echo: Echo, console: str, scenario: str
) -> None:
    """The owner (member_a) and the tenant's admins (admin_a, dual) get through until tenant A is deactivated
    or they are removed from it; then they get what a stranger gets, over HTTP and WebSocket."""
    notebook(world, ECHO_ID, echo.endpoint)
    lose, personas = LOSS[scenario]
    reaching = [p for p in ("member_a", "admin_a", "dual") if p in personas]
    clients = {persona: browser(console, _user(world, persona)) for persona in reaching}
    try:
        for client in clients.values():
            assert client.get(f"/notebooks/{ECHO_ID}/api/status").status_code == 200
        lose(world)
        for persona, client in clients.items():
            answer = client.get(f"/notebooks/{ECHO_ID}/api/status")
            assert (answer.status_code, answer.text) == (404, "Not found."), persona
            assert client.post(f"/notebooks/{ECHO_ID}/api/kernels", json={}).status_code == 404, persona
            assert refused_handshake(console, client, f"/notebooks/{ECHO_ID}/api/events/subscribe") == 403, persona
    finally:
        for client in clients.values():
            client.close()


def test_a_deactivated_user_reaches_no_notebook(world: World, echo: Echo, console: str) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    with browser(console, world.member_a) as owner:
        assert owner.get(f"/notebooks/{ECHO_ID}/api/status").status_code == 200
        world.member_a.is_active = False
        world.member_a.save(update_fields=["is_active"])
        assert owner.get(f"/notebooks/{ECHO_ID}/api/status").status_code == 404
        assert refused_handshake(console, owner, f"/notebooks/{ECHO_ID}/api/events/subscribe") == 403


def _closed_with(channel: Connection) -> int | None:
    """Return the close code the proxy sent, reading past any frame still on its way; fails after 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            channel.recv(timeout=max(deadline - time.monotonic(), 0.01))
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd is not None else None
    raise AssertionError("the proxy kept the connection open")


@pytest.mark.parametrize("scenario", sorted(LOSS))
def test_an_open_kernel_connection_closes_4403_as_soon_as_access_is_lost(
    world: World, echo: Echo, console: str, scenario: str, settings: Any
) -> None:
    """The announcement that closes the live streams closes the proxied WebSocket too (the periodic
    re-check is an hour away here); whoever keeps access stays connected."""
    settings.LIVE_RECHECK_SECONDS = 3600
    notebook(world, ECHO_ID, echo.websockets_endpoint)
    path = f"/notebooks/{ECHO_ID}/api/kernels/k/channels"
    lose, _ = LOSS[scenario]
    with (
        browser(console, world.member_a) as owner,
        browser(console, world.admin_a) as admin,
        websocket(console, owner, path) as owners,
        websocket(console, admin, path) as admins,
    ):
        for channel in (owners, admins):
            channel.send("hello")
            assert channel.recv(timeout=10) == "hello"
        began = time.monotonic()
        lose(world)
        assert _closed_with(owners) == 4403
        assert time.monotonic() - began < 5
        if scenario == "deactivated":
            assert _closed_with(admins) == 4403
        else:
            admins.send("still here")
            assert admins.recv(timeout=10) == "still here"
    assert wait_for(lambda: all("close_code" in seen for seen in echo.websockets[-2:]))


def test_an_access_change_without_announcement_is_caught_by_the_periodic_recheck(
    world: World, echo: Echo, console: str, settings: Any
) -> None:
    settings.LIVE_RECHECK_SECONDS = 1
    notebook(world, ECHO_ID, echo.websockets_endpoint)
    path = f"/notebooks/{ECHO_ID}/api/kernels/k/channels"
    with browser(console, world.member_a) as owner, websocket(console, owner, path) as channel:
        channel.send("hello")
        assert channel.recv(timeout=10) == "hello"
        Tenant.objects.filter(pk=world.tenant_a.pk).update(is_active=False)  # no signal, no announcement
        assert _closed_with(channel) == 4403


def _asgi_apps(app: Any, seen: set[int] | None = None) -> list[Any]:
    """Return every ASGI app the console's application is built of, outermost first."""
    seen = seen if seen is not None else set()
    if app is None or id(app) in seen or isinstance(app, str | int | float | bool):
        return []
    seen.add(id(app))
    found = [app]
    for name in ("app", "inner", "application"):
        found += _asgi_apps(getattr(app, name, None), seen)
    for inner in (getattr(app, "application_mapping", None) or {}).values():
        found += _asgi_apps(inner, seen)
    return found


# The console's own ASGI apps that answer requests themselves, and the tests that hold them to the contract.
ASGI_ROUTES = {
    "jobs.proxy.NotebookProxy": "this module: the notebook proxy, HTTP and WebSocket",
    "jobs.api.fast_ingest.SubmissionIngest": "tests/jobs/test_fast_ingest.py: the same answers as the API's contract",
    "frontend.consumers.auth.LiveAuthMiddleware": "tests/frontend/test_live_contract.py: every WebSocket route",
}


def test_every_route_the_asgi_application_serves_itself_is_covered() -> None:
    """Fails naming each of the console's own ASGI apps in front of Django and Channels that no test covers."""
    ours = ("gpucloud.", "jobs.", "frontend.", "tenants.", "inventory.")
    names = {
        f"{type(app).__module__}.{type(app).__qualname__}"
        for app in _asgi_apps(application)
        if type(app).__module__.startswith(ours)
    }
    assert "jobs.proxy.NotebookProxy" in names, "the walk found the proxy"
    assert names == set(ASGI_ROUTES), f"ASGI apps without an access contract: {sorted(names - set(ASGI_ROUTES))}"


@pytest.mark.parametrize(
    "change",
    [
        {"state": WorkloadState.PENDING},
        {"state": WorkloadState.SUCCEEDED},
        {"kind": WorkloadKind.JOB},
        {"session_secret": ""},
        {"attempt": 2},  # the replica row belongs to attempt 1
    ],
)
def test_a_notebook_that_is_not_live_is_not_found_even_for_its_owner(
    world: World, jupyter: str, console: str, change: dict[str, Any]
) -> None:
    workload = notebook(world, JUPYTER_ID, jupyter)
    with browser(console, world.member_a) as owner:
        assert owner.get(f"/notebooks/{JUPYTER_ID}/api/status").status_code == 200
        Workload.all_tenants.filter(pk=workload.pk).update(**change)
        assert owner.get(f"/notebooks/{JUPYTER_ID}/api/status").status_code == 404
        assert owner.get("/notebooks/999999/api/status").status_code == 404


# --- what crosses the proxy, against an echoing upstream --------------------------------------------------


def test_the_upstream_gets_the_token_and_never_the_console_session_or_credentials(
    world: World, echo: Echo, console: str
) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    body = secrets.token_bytes(3 * 1024 * 1024)
    with browser(console, world.member_a) as owner:
        answer = owner.post(
            f"/notebooks/{ECHO_ID}/api/contents/x?a=1&b=%2F",
            content=body,
            headers={"Authorization": "Bearer stolen", "X-CSRFToken": "console-csrf-token", "Connection": "X-Hop"}
            | {"X-Hop": "1", "Keep-Alive": "timeout=1"},
        )
    assert answer.status_code == 200
    seen = echo.requests[-1]
    assert seen["path"] == f"/notebooks/{ECHO_ID}/api/contents/x?a=1&b=%2F"
    assert hashlib.sha256(seen["body"]).digest() == hashlib.sha256(body).digest()
    headers = {name.lower(): value for name, value in seen["headers"].items()}
    assert headers["authorization"] == f"token {SECRET}"
    assert headers["cookie"] == "theme=dark", "the console's session and CSRF cookies never leave the console"
    assert headers["host"] == echo.endpoint.removeprefix("http://")
    assert headers["origin"] == echo.endpoint
    assert not {"x-csrftoken", "x-hop", "keep-alive"} & set(headers)
    # The browser sees: Jupyter's XSRF cookie only, no hop-by-hop header, the secret masked.
    assert answer.headers.get_list("set-cookie") == ["_xsrf=x; Path=/"]
    assert "keep-alive" not in answer.headers
    assert answer.headers["x-echo-token"] == "token=" + "*" * len(SECRET)
    assert answer.json()["authorization"] == "token " + "*" * len(SECRET)


@pytest.mark.parametrize(
    "foreign",
    [
        "https://evil.example",
        "console",  # the console's own origin is not the notebook's
        "http://localhost:1",  # the notebook's host on another port
        "https://localhost:{port}",  # the notebook's host and port over another scheme
        "http://localhost",  # the notebook's host on the default port
        "null",
    ],
)
def test_unsafe_requests_and_websockets_need_the_notebooks_own_origin_scheme_host_and_port(
    world: World, echo: Echo, console: str, foreign: str
) -> None:
    notebook(world, ECHO_ID, echo.websockets_endpoint)
    port = str(urlsplit(console).port)
    origin = console if foreign == "console" else foreign.replace("{port}", port)
    with browser(console, world.member_a) as owner:
        refused = owner.post(f"/notebooks/{ECHO_ID}/api/kernels", json={}, headers={"Origin": origin})
        assert (refused.status_code, refused.text) == (403, "Cross-origin request refused.")
        cookie = "; ".join(f"{c.name}={c.value}" for c in owner.cookies.jar if c.path == f"/notebooks/{ECHO_ID}/")
        url = str(owner.base_url).replace("http", "ws", 1).rstrip("/") + f"/notebooks/{ECHO_ID}/api/kernels/k/channels"
        with pytest.raises(InvalidStatus) as handshake:
            ws_connect(url, additional_headers={"Cookie": cookie}, origin=origin, open_timeout=30).close()  # type: ignore[arg-type]
        assert handshake.value.response.status_code == 403
        websocket(console, owner, f"/notebooks/{ECHO_ID}/api/kernels/k/channels").close()  # its own origin passes


def test_unsafe_requests_without_an_origin_are_refused(world: World, echo: Echo, console: str) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    with browser(console, world.member_a) as owner:
        del owner.headers["Origin"]
        without = owner.delete(f"/notebooks/{ECHO_ID}/api/kernels/k")
        assert (without.status_code, without.text) == (403, "Cross-origin request refused.")
        assert owner.get(f"/notebooks/{ECHO_ID}/api/status").status_code == 200, "safe methods need no Origin"
    assert [r["method"] for r in echo.requests[-1:]] == ["GET"]


def test_frames_are_relayed_both_ways_and_each_side_closing_closes_the_other(
    world: World, echo: Echo, console: str
) -> None:
    notebook(world, ECHO_ID, echo.websockets_endpoint)
    with browser(console, world.member_a) as owner:
        path = f"/notebooks/{ECHO_ID}/api/kernels/k/channels?session_id=s"
        with websocket(console, owner, path) as channel:
            channel.send("hello")
            assert channel.recv(timeout=10) == "hello"
            channel.send(b"\x00\xffbinary")
            assert channel.recv(timeout=10) == b"\x00\xffbinary"
            channel.send(f"the secret is {SECRET}")
            assert channel.recv(timeout=10) == "the secret is " + "*" * len(SECRET)
            channel.close(4002, "browser leaves")
        assert wait_for(lambda: echo.websockets[-1].get("close_code") == 4002)
        seen = echo.websockets[-1]
        assert seen["path"] == path
        headers = {name.lower(): value for name, value in seen["headers"].items()}
        assert headers["authorization"] == f"token {SECRET}" and headers["origin"] == echo.websockets_endpoint
        assert "sessionid" not in headers.get("cookie", "") and "csrftoken" not in headers.get("cookie", "")

        with websocket(console, owner, path) as channel:
            channel.send("close 4003")
            with pytest.raises(ConnectionClosed) as closed:
                channel.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4003


class Recorder:
    """An ASGI app around the console that records how each notebook WebSocket connection's call ended."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.ended: list[BaseException | None] = []
        self.count = threading.Semaphore(0)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except BaseException as error:
            self.ended.append(error)
            raise
        else:
            self.ended.append(None)
        finally:
            self.count.release()

    def next_end(self) -> BaseException | None:
        assert self.count.acquire(timeout=20), "the proxy never finished the connection"
        return self.ended[-1]


@pytest.mark.parametrize("first", ["browser", "upstream", "both"])
def test_the_websocket_leg_closes_once_whichever_side_closes_first(world: World, echo: Echo, first: str) -> None:
    """Each side's close is relayed to the other once, and nothing is sent to a browser that has gone:
    sending a second close made the server raise `Unexpected ASGI message 'websocket.close'`."""
    notebook(world, ECHO_ID, echo.websockets_endpoint)
    recorder = Recorder(application)
    path = f"/notebooks/{ECHO_ID}/api/kernels/k/channels"
    with (
        uvicorn_server(recorder) as console,
        override_settings(NOTEBOOK_ORIGIN=parse_origin_pattern(notebooks_of(console))),
        browser(console, world.member_a) as owner,
    ):
        for _ in range(10):
            channel = websocket(console, owner, path)
            channel.send("hello")
            assert channel.recv(timeout=10) == "hello"
            if first in ("upstream", "both"):
                channel.send("close 4003")
            if first in ("browser", "both"):
                channel.close(4002)
            else:
                with pytest.raises(ConnectionClosed):
                    channel.recv(timeout=10)
                channel.close()
            assert recorder.next_end() is None, recorder.ended[-1]


def test_a_browser_that_leaves_mid_download_stops_the_upstream_transfer(world: World, echo: Echo, console: str) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    with browser(console, world.member_a) as owner, owner.stream("GET", f"/notebooks/{ECHO_ID}/stream") as endless:
        assert len(next(endless.iter_raw())) > 0
    assert echo.stream_ended.wait(timeout=20), "the proxy kept reading for a browser that left"


def test_an_unreachable_upstream_is_a_502_and_a_refused_handshake(world: World, console: str) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
    notebook(world, ECHO_ID, nowhere)
    with browser(console, world.member_a) as owner:
        began = time.monotonic()
        answer = owner.get(f"/notebooks/{ECHO_ID}/api/status")
        assert (answer.status_code, answer.text) == (502, "The notebook server cannot be reached.")
        assert refused_handshake(console, owner, f"/notebooks/{ECHO_ID}/api/events/subscribe") == 403
        assert time.monotonic() - began < 15


def test_the_notebook_origin_serves_nothing_of_the_console_and_the_console_no_notebook(
    world: World, echo: Echo, console: str
) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    reached = len(echo.requests)
    with browser(console, world.member_a) as owner:
        for path in (
            "/login/",
            "/",
            "/api/v1/tenants/",
            "/static/gpucloud.css",
            "/admin/",
            "/notebooks/abc/api/status",
        ):
            answer = owner.get(path)
            assert (answer.status_code, answer.text) == (404, "Not found."), path
        assert refused_handshake(console, owner, "/live/workloads/") == 403
    # The console only hands over: with its session, a notebook's path is a redirect to the hand-off.
    session = Client()
    session.force_login(world.member_a)
    moved = session.get(f"/notebooks/{ECHO_ID}/api/status")
    assert (moved.status_code, moved["Location"]) == (302, f"/notebooks/{ECHO_ID}/open?next=api%2Fstatus")
    assert session.post(f"/notebooks/{ECHO_ID}/api/kernels").status_code == 405
    assert len(echo.requests) == reached, "nothing on the console reached the notebook"


# --- pieces -----------------------------------------------------------------------------------------------


def test_the_mask_catches_the_secret_split_across_any_chunk_boundary() -> None:
    secret = "s3cr3t-t0ken"
    stream = f"before {secret} middle {secret}{secret} after s3cr".encode()
    expected = stream.replace(secret.encode(), b"*" * len(secret))
    for size in range(1, len(stream) + 1):
        mask = SecretMask(secret)
        chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
        assert b"".join(mask.feed(chunk) for chunk in chunks) + mask.flush() == expected, size
    # Nothing that cannot start the secret is held back: streamed output is not delayed.
    assert SecretMask(secret).feed(b"plain output\n") == b"plain output\n"


def test_the_mask_holds_back_exactly_the_longest_tail_that_could_begin_the_secret() -> None:
    # The secret repeats its first byte, so a tail may hold several candidate starts.
    secret = "aab-aa"
    stream = b"xaaab-aaaab-aa-aab-a" + b"aab-aa"[:-1]
    expected = stream.replace(secret.encode(), b"*" * len(secret))
    for size in range(1, len(stream) + 1):
        mask = SecretMask(secret)
        released = b""
        for i in range(0, len(stream), size):
            released += mask.feed(stream[i : i + size])
            seen = stream[: i + size].replace(secret.encode(), b"*" * len(secret))
            held = len(seen) - len(released)
            tails = [n for n in range(1, len(secret)) if seen.endswith(secret[:n].encode())]
            assert held == max(tails, default=0), (size, i)
        assert released + mask.flush() == expected, size


def test_the_selector_is_the_one_check(world: World) -> None:
    workload = notebook(world, 77, "http://127.0.0.1:1")
    target = notebook_proxy_target(world.member_a, workload.pk)
    assert target is not None and (target.endpoint, target.secret) == ("http://127.0.0.1:1", SECRET)
    assert SECRET not in repr(target)
    assert notebook_proxy_target(world.admin_a, workload.pk) is not None
    for user in (world.viewer_a, world.admin_b, world.operator):
        assert notebook_proxy_target(user, workload.pk) is None
    Tenant.objects.filter(pk=world.tenant_a.pk).update(is_active=False)
    for user in (world.member_a, world.admin_a):
        assert notebook_proxy_target(user, workload.pk) is None, "a deactivated tenant's notebooks serve nobody"
