"""The console's Content-Security-Policy (common/csp.py) blocks nothing its own pages need.

Every browser test's page fails on a CSP violation Chromium reports
(tests/browser/conftest.py); these walk the pages with the most script
(live views, charts, the file browser, the API docs, the admin) under the
ASGI server, so WebSockets connect under the policy too.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.test_console import log_in
from tests.conftest import World

pytestmark = pytest.mark.browser

PAGES = [
    "/t/tenant-a/",
    "/t/tenant-a/workloads/",
    "/t/tenant-a/queue/",
    "/t/tenant-a/usage/",
    "/t/tenant-a/storage/",
    "/ops/cluster/",
    "/api/v1/docs/",
    "/admin/",
]


def test_the_console_pages_run_under_the_policy(live_world: World, live_page: Any) -> None:
    log_in(live_page, "operator")
    live_page.wait_for_load_state("networkidle")
    for path in PAGES:
        response = live_page.goto(path)
        assert response is not None and response.status == 200, path
        header = response.headers["content-security-policy"]
        # Directive order in the header is not fixed; compare them by name.
        policy = dict(part.strip().split(" ", 1) for part in header.split(";") if part.strip())
        assert policy["script-src"] == "'self'" and policy["frame-ancestors"] == "'none'", header
        live_page.wait_for_load_state("networkidle")
    # The fixture fails the test on any violation Chromium reported on these pages.


def test_an_injected_inline_script_is_refused(live_world: World, browser: Any, asgi_server: str) -> None:
    context = browser.new_context(base_url=asgi_server)
    tab = context.new_page()
    blocked: list[str] = []
    tab.on("console", lambda message: blocked.append(message.text) if "Content Security" in message.text else None)
    tab.goto("/login/")
    tab.evaluate(
        """() => { const s = document.createElement("script"); s.textContent = "window.ran = 1";
        document.body.appendChild(s); }"""
    )
    ran = tab.evaluate("() => window.ran")
    context.close()
    assert ran is None and any("script-src" in text for text in blocked), blocked
