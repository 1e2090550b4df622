"""Browser fixtures: Debian's Chromium driven by Playwright against pytest-django's live server (WSGI),
or against the console's ASGI application under uvicorn where a page needs its WebSockets (`live_page`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

from tests.conftest import World, chromium_path
from tests.workers import uvicorn_server


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

    Static files come from the finders, as the live server serves them: tests run no collectstatic.
    """
    from gpucloud.asgi import application

    # The handler passes anything but static files on to any ASGI app; the stubs only name Django's own.
    served = ASGIStaticFilesHandler(application)  # type: ignore[arg-type]
    with uvicorn_server(served) as url:
        yield url


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    """A fresh browser page that fails the test on any failed static file or script error."""
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
    tab.on(
        "response",
        lambda response: problems.append(f"{response.status} {response.url}")
        if "/static/" in response.url and response.status >= 400
        else None,
    )
    yield tab
    context.close()
    assert not problems, problems
