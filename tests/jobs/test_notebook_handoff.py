"""The hand-off from the console to the notebook origin, and the split between the two origins.

One-time tickets (expired, reused, another notebook's, who gets one at
all, single use across processes), the notebook origin's own cookie (its
attributes, bound to its user, notebook and console session), and that
neither origin accepts the other's credentials: the console never takes
the notebook cookie nor a live stream from the notebook origin. Served by
the console's ASGI application under uvicorn against a header-echoing
upstream (`tests.jobs.test_proxy`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache.backends.redis import RedisCache
from django.test import Client, override_settings
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from common.origins import parse_origin_pattern
from jobs.checks import notebook_origin_errors
from jobs.models import Workload
from jobs.proxy.rewrite import SecretMask, downstream_headers
from jobs.services.notebook_entry import issue_ticket, redeem_ticket, safe_next
from tenants.models import Membership
from tests.conftest import World
from tests.jobs.test_proxy import ECHO_ID, Echo, another_member, console, echo, notebook, notebooks_of
from tests.workers import wait_for_idle_database

__all__ = ["console", "echo"]  # the servers this module shares with test_proxy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _idle_before_flush(transactional_db: None) -> Iterator[None]:
    """The live server may still be closing a WebSocket when a test ends; the flush waits for it."""
    yield
    wait_for_idle_database()


OTHER_ID = 4444


def session_of(user: User) -> str:
    """Return a console session key that signs `user` in."""
    login = Client()
    login.force_login(user)
    return str(login.cookies[settings.SESSION_COOKIE_NAME].value)


def ticket_for(user: User, workload: int = ECHO_ID, *, session: str | None = None, path: str | None = None) -> str:
    issued = issue_ticket(user=user, console_session=session or session_of(user), workload_id=workload, next_path=path)
    assert issued is not None
    return issued


def enter(console: str, ticket: str, workload: int = ECHO_ID) -> httpx.Response:
    """Redeem `ticket` at notebook `workload`'s entry on the notebook origin, as the browser's redirect does."""
    return httpx.get(f"{notebooks_of(console)}/notebooks/{workload}/gpucloud-enter", params={"ticket": ticket})


def cookie_of(entered: httpx.Response) -> dict[str, str]:
    value = entered.cookies.get(settings.NOTEBOOK_COOKIE_NAME)
    assert value, entered.headers
    return {settings.NOTEBOOK_COOKIE_NAME: value}


def on_notebook(console: str, cookies: dict[str, str], workload: int = ECHO_ID) -> int:
    url = f"{notebooks_of(console)}/notebooks/{workload}/api/status"
    return httpx.get(url, cookies=cookies, timeout=30).status_code


# --- tickets ------------------------------------------------------------------------------------------------


def test_the_console_hands_over_with_a_ticket_that_enters_once(world: World, echo: Echo, console: str) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    on_console = httpx.Client(base_url=console, cookies={settings.SESSION_COOKIE_NAME: session_of(world.member_a)})
    handed = on_console.get(f"/notebooks/{ECHO_ID}/open", params={"next": "lab/tree/runs/exp 1.ipynb"})
    assert handed.status_code == 302 and "no-cache" in handed.headers["cache-control"]
    entry = urlsplit(handed.headers["location"])
    assert f"{entry.scheme}://{entry.netloc}" == notebooks_of(console)
    assert entry.path == f"/notebooks/{ECHO_ID}/gpucloud-enter"
    first = httpx.get(handed.headers["location"])
    assert (first.status_code, first.headers["location"]) == (303, f"/notebooks/{ECHO_ID}/lab/tree/runs/exp%201.ipynb")
    set_cookie = first.headers["set-cookie"]
    assert set_cookie.startswith(f"{settings.NOTEBOOK_COOKIE_NAME}=")
    assert f"Path=/notebooks/{ECHO_ID}/;" in set_cookie and "HttpOnly" in set_cookie and "SameSite=Lax" in set_cookie
    assert "domain=" not in set_cookie.lower(), "host-only: no other host of the apps domain gets it"
    assert "Secure" not in set_cookie, "plain http here; Secure over https (test_cookie_is_secure_over_https)"
    assert on_notebook(console, cookie_of(first)) == 200
    again = httpx.get(handed.headers["location"])
    assert again.status_code == 404 and settings.NOTEBOOK_COOKIE_NAME not in again.cookies


def test_the_cookie_is_secure_over_https(world: World, echo: Echo) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    from jobs.proxy import _cookie

    with override_settings(NOTEBOOK_ORIGIN=parse_origin_pattern("https://nb-{id}.apps.example.org")):
        assert _cookie(ECHO_ID, "v").decode().endswith("; Secure")


def test_an_expired_ticket_is_refused(world: World, echo: Echo, console: str, settings: Any) -> None:
    settings.NOTEBOOK_HANDOFF_SECONDS = 1
    notebook(world, ECHO_ID, echo.endpoint)
    ticket = ticket_for(world.member_a)
    time.sleep(1.5)
    assert enter(console, ticket).status_code == 404


def test_a_ticket_of_another_notebook_is_refused_and_spent(world: World, echo: Echo, console: str) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    notebook(world, OTHER_ID, echo.endpoint)
    ticket = ticket_for(world.member_a, ECHO_ID)
    assert enter(console, ticket, OTHER_ID).status_code == 404
    assert enter(console, ticket, ECHO_ID).status_code == 404, "a ticket tried elsewhere is gone"
    assert enter(console, "made-up", ECHO_ID).status_code == 404
    moved = httpx.post(
        f"{notebooks_of(console)}/notebooks/{ECHO_ID}/gpucloud-enter?ticket={ticket_for(world.member_a)}"
    )
    assert moved.status_code == 404, "only GET redeems"


@pytest.mark.parametrize("who", ["outsider", "other_member", "viewer", "operator"])
def test_only_who_may_open_the_notebook_gets_a_ticket(world: World, echo: Echo, console: str, who: str) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    users = {"outsider": world.admin_b, "viewer": world.viewer_a, "operator": world.operator}
    user = another_member(world) if who == "other_member" else users[who]
    assert issue_ticket(user=user, console_session=session_of(user), workload_id=ECHO_ID) is None
    on_console = httpx.Client(base_url=console, cookies={settings.SESSION_COOKIE_NAME: session_of(user)})
    assert on_console.get(f"/notebooks/{ECHO_ID}/open").status_code == 404


def test_an_anonymous_visitor_is_sent_to_sign_in_first(world: World, echo: Echo, console: str) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    answer = httpx.get(f"{console}/notebooks/{ECHO_ID}/open")
    assert answer.status_code == 302 and answer.headers["location"].startswith("/login/")


@pytest.mark.redis
def test_a_ticket_is_spent_once_across_processes(world: World, echo: Echo) -> None:
    """Eight clients of the shared cache (as eight web processes hold) redeem one ticket at once: one gets in."""
    notebook(world, ECHO_ID, echo.endpoint)
    stores = [RedisCache(str(settings.REDIS_URL), {}) for _ in range(8)]
    ticket = issue_ticket(
        user=world.member_a, console_session=session_of(world.member_a), workload_id=ECHO_ID, store=stores[0]
    )
    assert ticket is not None
    start, results = threading.Barrier(len(stores)), []

    def redeem(store: RedisCache) -> None:
        start.wait()
        results.append(redeem_ticket(ticket, workload_id=ECHO_ID, store=store))

    threads = [threading.Thread(target=redeem, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == len(stores) and sum(result is not None for result in results) == 1


@pytest.mark.parametrize(
    ("given", "opened"),
    [
        (None, "lab"),
        ("lab/tree/a b.ipynb", "lab/tree/a b.ipynb"),
        ("/lab", "lab"),
        ("../../4343/lab", "lab"),
        ("lab/../../x", "lab"),
        ("lab//x", "lab"),
        ("lab\\..\\x", "lab"),
        ("lab/tree/", "lab/tree/"),
    ],
)
def test_the_path_to_open_stays_inside_the_notebook(given: str | None, opened: str) -> None:
    assert safe_next(given) == opened


# --- the cookie ---------------------------------------------------------------------------------------------


def test_the_cookie_stands_for_its_user_and_console_session(world: World, echo: Echo, console: str) -> None:
    """A cookie whose console session signs someone else in opens nothing; a console logout ends it."""
    notebook(world, ECHO_ID, echo.endpoint)
    crossed = enter(console, ticket_for(world.member_a, session=session_of(world.admin_a)))
    assert crossed.status_code == 303 and on_notebook(console, cookie_of(crossed)) == 404
    login = Client()
    login.force_login(world.member_a)
    mine = enter(console, ticket_for(world.member_a, session=login.cookies[settings.SESSION_COOKIE_NAME].value))
    assert on_notebook(console, cookie_of(mine)) == 200
    login.logout()
    assert on_notebook(console, cookie_of(mine)) == 404


def test_a_cookie_of_one_notebook_opens_no_other(world: World, echo: Echo, console: str) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    notebook(world, OTHER_ID, echo.endpoint)
    cookies = cookie_of(enter(console, ticket_for(world.admin_a, ECHO_ID)))
    assert on_notebook(console, cookies, ECHO_ID) == 200
    assert on_notebook(console, cookies, OTHER_ID) == 404


def test_revoked_access_ends_an_entered_cookie(world: World, echo: Echo, console: str) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    cookies = cookie_of(enter(console, ticket_for(world.member_a)))
    assert on_notebook(console, cookies) == 200
    Membership.all_tenants.filter(user=world.member_a).update(role="viewer")
    assert on_notebook(console, cookies) == 404
    Workload.all_tenants.filter(pk=ECHO_ID).delete()
    assert on_notebook(console, cookies) == 404


def test_a_per_notebook_host_serves_only_its_own_notebook(world: World, echo: Echo, console: str) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    port = urlsplit(console).port
    with override_settings(NOTEBOOK_ORIGIN=parse_origin_pattern(f"http://nb-{{id}}.localhost:{port}")):
        cookies = cookie_of(enter_at(console, f"nb-{ECHO_ID}.localhost", ticket_for(world.member_a)))
        own = httpx.get(
            f"{console}/notebooks/{ECHO_ID}/api/status",
            headers={"Host": f"nb-{ECHO_ID}.localhost:{port}"},
            cookies=cookies,
        )
        other = httpx.get(
            f"{console}/notebooks/{ECHO_ID}/api/status", headers={"Host": f"nb-1.localhost:{port}"}, cookies=cookies
        )
    assert (own.status_code, other.status_code) == (200, 404)


def enter_at(console: str, host: str, ticket: str) -> httpx.Response:
    """Redeem `ticket` on the test server, sending `host` as a browser on that host would."""
    port = urlsplit(console).port
    url = f"{console}/notebooks/{ECHO_ID}/gpucloud-enter"
    return httpx.get(url, params={"ticket": ticket}, headers={"Host": f"{host}:{port}"})


# --- neither origin takes the other's credentials ------------------------------------------------------------


def test_the_console_never_accepts_the_notebook_cookie(world: World, echo: Echo, console: str) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    cookies = cookie_of(enter(console, ticket_for(world.admin_a)))
    api = httpx.get(f"{console}/api/v1/tenants/tenant-a/workloads/", cookies=cookies)
    page = httpx.get(f"{console}/t/tenant-a/", cookies=cookies)
    assert api.status_code in (401, 403) and page.status_code == 302 and "/login/" in page.headers["location"]


def test_the_upstream_never_sees_the_notebook_cookie(world: World, echo: Echo, console: str) -> None:
    notebook(world, ECHO_ID, echo.endpoint)
    cookies = cookie_of(enter(console, ticket_for(world.member_a))) | {"theme": "dark"}
    assert on_notebook(console, cookies) == 200
    headers = {name.lower(): value for name, value in echo.requests[-1]["headers"].items()}
    assert headers["cookie"] == "theme=dark"


@pytest.mark.parametrize("origin", ["notebooks", "console-other-port", "console-https"])
def test_the_consoles_live_streams_refuse_every_origin_but_the_consoles_own(
    world: World, console: str, origin: str
) -> None:
    """The live streams' Origin rule compares scheme, host and port: the notebook origin shares the console's
    host on one machine, and a browser sends the console's session cookie to it."""
    port = urlsplit(console).port
    foreign = {
        "notebooks": f"http://127.0.0.1:{port}".replace("127.0.0.1", "localhost"),
        "console-other-port": f"http://127.0.0.1:{(port or 0) + 1}",
        "console-https": f"https://127.0.0.1:{port}",
    }[origin]
    url = console.replace("http", "ws", 1) + "/ws/t/tenant-a/events/"
    cookie = f"{settings.SESSION_COOKIE_NAME}={session_of(world.admin_a)}"
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(url, additional_headers={"Cookie": cookie}, origin=foreign, open_timeout=30).close()  # type: ignore[arg-type]
    assert refused.value.response.status_code == 403
    ws_connect(url, additional_headers={"Cookie": cookie}, origin=console, open_timeout=30).close()  # type: ignore[arg-type]


def test_no_service_worker_scope_is_widened_and_notebook_pages_are_hardened() -> None:
    upstream = [
        (b"Service-Worker-Allowed", b"/"),
        (b"Content-Type", b"text/html"),
        (b"Referrer-Policy", b"no-referrer"),
    ]
    headers = dict(downstream_headers(upstream, SecretMask("s")))
    assert b"service-worker-allowed" not in headers
    assert headers[b"x-content-type-options"] == b"nosniff" and headers[b"cross-origin-opener-policy"] == b"same-origin"
    assert headers[b"referrer-policy"] == b"no-referrer", "the upstream's own choice stays"


def test_console_responses_allow_no_service_worker_scope(world: World, console: str) -> None:
    for path in ("/login/", "/", "/healthz"):
        assert "service-worker-allowed" not in httpx.get(f"{console}{path}").headers


# --- configuration ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"NOTEBOOK_ORIGIN": None}, "is not set"),
        ({"NOTEBOOK_ORIGIN": "https://console.example.org"}, "ALLOWED_HOSTS"),
        ({"CSRF_TRUSTED_ORIGINS": ["https://*.example.org"]}, "CSRF_TRUSTED_ORIGINS"),
        ({"SESSION_COOKIE_DOMAIN": ".example.org"}, "SESSION_COOKIE_DOMAIN"),
        ({"NOTEBOOK_ORIGIN": "http://nb-{id}.apps.example.org"}, "plain http"),
        ({}, None),
    ],
)
def test_the_notebook_origin_must_be_set_and_not_the_consoles(overrides: dict[str, Any], problem: str | None) -> None:
    configured: dict[str, Any] = {
        "ALLOWED_HOSTS": ["console.example.org"],
        "HTTPS": True,
        "NOTEBOOK_ORIGIN": "https://nb-{id}.apps.example.org",
    } | overrides
    if configured["NOTEBOOK_ORIGIN"] is not None:
        configured["NOTEBOOK_ORIGIN"] = parse_origin_pattern(configured["NOTEBOOK_ORIGIN"])
    with override_settings(**configured):
        errors = notebook_origin_errors()
    if problem is None:
        assert errors == []
    else:
        assert len(errors) == 1 and problem in errors[0], errors
