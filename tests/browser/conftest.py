"""Browser fixtures: Debian's Chromium driven by Playwright against pytest-django's live server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import World, chromium_path


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


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    """A fresh browser page that fails the test on any failed static file or script error."""
    context = browser.new_context(base_url=live_server.url)
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
