"""Browser fixtures: Debian's Chromium driven by Playwright against pytest-django's live server (WSGI),
or against the console's ASGI application under uvicorn where a page needs its WebSockets (`live_page`)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.test import override_settings

from common.origins import parse_origin_pattern
from tests.conftest import World, chromium_path
from tests.workers import wait_until


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one test module; Playwright's event loop runs on this thread until the module ends."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("no Chromium")  # the `browser` marker turns this into a failure where Chromium is required
    from playwright.sync_api import sync_playwright

    # With that loop running, Django would refuse the ORM calls that tests
    # make between browser steps, although they are plain synchronous code.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        chromium = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-background-networking"]
        )
        yield chromium
        chromium.close()


@pytest.fixture
def live_world(browser: Any, transactional_db: None, world: World) -> World:
    return world


@pytest.fixture(scope="module")
def asgi_server() -> Iterator[str]:
    """The console's ASGI application (HTTP, WebSockets) under uvicorn on a free loopback port; yields its URL.

    As `gpucloud up` serves it: the notebook origin on a second loopback port of the same server
    (`notebook_origin`). Static files come from the finders, as the live server serves them: tests run no
    collectstatic.
    """
    with console_and_notebooks() as (console, _):
        yield console


@contextmanager
def console_and_notebooks() -> Iterator[tuple[str, str]]:
    """Serve the console's ASGI application on two free loopback ports, the second as NOTEBOOK_ORIGIN, as
    `gpucloud up` does; yield (console URL, notebook origin)."""
    from gpucloud.asgi import application

    # The handler passes anything but static files on to any ASGI app; the stubs only name Django's own.
    served = ASGIStaticFilesHandler(application)  # type: ignore[arg-type]
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    console, notebooks = (f"http://127.0.0.1:{sock.getsockname()[1]}" for sock in sockets)
    server = uvicorn.Server(uvicorn.Config(served, lifespan="on", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    with override_settings(NOTEBOOK_ORIGIN=parse_origin_pattern(notebooks)):
        thread.start()
        try:
            assert wait_until(lambda: server.started, timeout=20, interval=0.02), "uvicorn did not start"
            yield console, notebooks
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            for sock in sockets:
                sock.close()


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    """A fresh browser page that fails the test on any failed static file, script error or CSP violation."""
    yield from _checked_page(browser, live_server.url)


@pytest.fixture
def live_page(browser: Any, asgi_server: str) -> Iterator[Any]:
    """A fresh browser page on the ASGI server, so its live views connect; fails the test as `page` does."""
    yield from _checked_page(browser, asgi_server)


def _checked_page(browser: Any, base_url: str) -> Iterator[Any]:
    context = browser.new_context(base_url=base_url)
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(f"script error: {error}"))
    # Chromium reports what the Content-Security-Policy blocked on the console: the UI must need nothing it blocks.
    tab.on(
        "console",
        lambda message: problems.append(f"CSP: {message.text}") if "Content Security Policy" in message.text else None,
    )
    tab.on(
        "response",
        lambda response: problems.append(f"{response.status} {response.url}")
        if "/static/" in response.url and response.status >= 400
        else None,
    )
    yield tab
    context.close()
    assert not problems, problems


def wait_for_true(page: Any, expression: str, *, timeout: float = 30_000) -> None:
    """Wait until `expression` is truthy on `page`; raise Playwright's TimeoutError after `timeout` ms.

    Playwright's `wait_for_function` evaluates its predicate with eval, which the console's
    Content-Security-Policy refuses (no 'unsafe-eval'); `page.evaluate` is not subject to it.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    deadline = time.monotonic() + timeout / 1000
    while not page.evaluate(f"() => Boolean({expression})"):
        if time.monotonic() > deadline:
            raise PlaywrightTimeout(f"never true: {expression}")
        time.sleep(0.02)
